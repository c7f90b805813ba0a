"""Media URL fetching against a local HTTP server: size and time limits, bounded redirects, and
the refusal of loopback / private / link-local addresses unless explicitly allowed."""

from __future__ import annotations

import http.server
import ipaddress
import threading
import time
from collections.abc import Iterator

import pytest

from ninfer.media import fetch as fetch_mod
from ninfer.media.errors import MediaError
from ninfer.media.fetch import FetchPolicy, fetch

BODY = bytes(range(256)) * 40  # 10240 bytes


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_GET(self) -> None:  # noqa: N802
        port = self.server.server_address[1]
        path = self.path
        if path == "/ok":
            self._send(200, BODY)
        elif path == "/lying-length":  # no Content-Length: the cap applies while streaming
            self.send_response(200)
            self.end_headers()
            self.wfile.write(BODY * 4)
        elif path.startswith("/hop/"):
            n = int(path.rsplit("/", 1)[1])
            self.send_response(302)
            self.send_header("Location", "/ok" if n == 0 else f"/hop/{n - 1}")
            self.end_headers()
        elif path == "/loop":
            self.send_response(301)
            self.send_header("Location", "/loop")
            self.end_headers()
        elif path == "/to-other":
            self.send_response(307)
            self.send_header("Location", f"http://127.0.0.2:{port}/ok")
            self.end_headers()
        elif path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            for i in range(0, len(BODY), 1024):
                self.wfile.write(BODY[i : i + 1024])
                self.wfile.flush()
                time.sleep(0.3)
        elif path == "/missing":
            self._send(404, b"no")
        else:
            self._send(500, b"?")

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


OPEN = FetchPolicy(allow_private=True, max_bytes=100_000, timeout_s=5.0, max_redirects=3)


def _code(url: str, policy: FetchPolicy) -> tuple[str, str]:
    with pytest.raises(MediaError) as e:
        fetch(url, policy)
    return e.value.code, e.value.message


def test_loopback_is_refused_by_default(server: str) -> None:
    code, message = _code(server + "/ok", FetchPolicy())
    assert code == "media_fetch_failed" and "non-public address" in message


def test_allowed_private_fetch_returns_the_body(server: str) -> None:
    assert fetch(server + "/ok", OPEN) == BODY


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.9",
        "192.168.1.1",
        "169.254.169.254",
        "::1",
        "fe80::1",
        "fc00::5",
        "::ffff:10.0.0.1",
        "0.0.0.0",
        "224.0.0.1",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert fetch_mod._refused(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert not fetch_mod._refused(ipaddress.ip_address(address))


def test_size_limit_by_header_and_while_streaming(server: str) -> None:
    small = FetchPolicy(allow_private=True, max_bytes=5000)
    assert _code(server + "/ok", small)[0] == "media_budget_exceeded"
    capped = FetchPolicy(allow_private=True, max_bytes=len(BODY) * 2)
    assert _code(server + "/lying-length", capped)[0] == "media_budget_exceeded"


def test_redirects_are_followed_up_to_the_bound(server: str) -> None:
    assert fetch(server + "/hop/2", OPEN) == BODY  # 3 redirects
    code, message = _code(server + "/hop/3", OPEN)  # 4 redirects
    assert code == "media_fetch_failed" and "redirected more than 3" in message
    assert _code(server + "/loop", OPEN)[0] == "media_fetch_failed"


def test_each_redirect_hop_is_checked(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A redirect to a refused address fails before any connection is made to it."""
    refused = ipaddress.ip_address("127.0.0.2")
    monkeypatch.setattr(fetch_mod, "_refused", lambda ip: ip == refused)
    policy = FetchPolicy(max_bytes=100_000, timeout_s=5.0)
    assert fetch(server + "/ok", policy) == BODY
    code, message = _code(server + "/to-other", policy)
    assert code == "media_fetch_failed" and "127.0.0.2" in message


def test_whole_fetch_deadline(server: str) -> None:
    policy = FetchPolicy(allow_private=True, timeout_s=0.5)
    start = time.monotonic()
    assert _code(server + "/slow", policy)[0] == "media_fetch_timeout"
    assert time.monotonic() - start < 2.5  # the body alone takes 3 s


def test_http_errors_and_bad_urls(server: str) -> None:
    code, message = _code(server + "/missing", OPEN)
    assert code == "media_fetch_failed" and "404" in message
    assert _code("ftp://example.com/x.png", OPEN)[0] == "invalid_media"
    assert _code("http://no-such-host.invalid/x.png", OPEN)[0] == "media_fetch_failed"
