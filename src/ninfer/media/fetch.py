"""Fetch media over http(s) without becoming a way into the server's own network.

Imports the standard library only. Every hop (the URL and each redirect) resolves its host once,
refuses loopback, private, link-local, multicast, reserved and unspecified addresses unless the
policy allows private ones, and then connects to exactly the address it checked (no second DNS
lookup an attacker could answer differently). The body streams under a byte cap and one overall
deadline; redirects are bounded.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from ninfer.media.errors import (
    MEDIA_BUDGET_EXCEEDED,
    MEDIA_FETCH_FAILED,
    MEDIA_FETCH_TIMEOUT,
    MediaError,
)

_CHUNK = 64 * 1024


@dataclass(frozen=True)
class FetchPolicy:
    max_bytes: int = 64 * 1024 * 1024
    timeout_s: float = 20.0  # the whole fetch, redirects included
    max_redirects: int = 3
    allow_private: bool = False  # `--allow-private-media-urls`


def _refused(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
    )


def _resolve(host: str, port: int, policy: FetchPolicy) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise MediaError(f"cannot resolve media host {host!r}", code=MEDIA_FETCH_FAILED) from e
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    if not policy.allow_private:
        for ip in addresses:
            if _refused(ip):
                raise MediaError(
                    f"media host {host!r} resolves to a non-public address ({ip}); the server "
                    "refuses to fetch from loopback, private and link-local networks",
                    code=MEDIA_FETCH_FAILED,
                )
    return str(addresses[0])


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise MediaError("media fetch timed out", code=MEDIA_FETCH_TIMEOUT)
    return left


def _open(
    url: str, policy: FetchPolicy, deadline: float
) -> tuple[http.client.HTTPResponse, socket.socket]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise MediaError(f"unsupported media URL {url[:100]!r} (use http, https or data URIs)")
    host = parts.hostname
    port = parts.port or (443 if scheme == "https" else 80)
    ip = _resolve(host, port, policy)
    sock = socket.create_connection((ip, port), timeout=_remaining(deadline))
    if scheme == "https":
        sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
    conn_cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(host, port, timeout=_remaining(deadline))
    conn.sock = sock  # already connected to the checked address
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    conn.request("GET", path, headers={"User-Agent": "ninfer-media", "Accept": "*/*"})
    return conn.getresponse(), sock


def fetch(url: str, policy: FetchPolicy) -> bytes:
    """The body of `url` after at most `policy.max_redirects` redirects."""
    deadline = time.monotonic() + policy.timeout_s
    try:
        for _ in range(policy.max_redirects + 1):
            resp, sock = _open(url, policy, deadline)
            if resp.status in (301, 302, 303, 307, 308):
                location = resp.getheader("Location")
                resp.close()
                if not location:
                    raise MediaError("media redirect without a Location", code=MEDIA_FETCH_FAILED)
                url = urljoin(url, location)
                continue
            if resp.status != 200:
                resp.close()
                raise MediaError(f"media URL answered HTTP {resp.status}", code=MEDIA_FETCH_FAILED)
            return _read(resp, sock, policy, deadline)
        raise MediaError(
            f"media URL redirected more than {policy.max_redirects} times",
            code=MEDIA_FETCH_FAILED,
        )
    except MediaError:
        raise
    except TimeoutError as e:
        raise MediaError("media fetch timed out", code=MEDIA_FETCH_TIMEOUT) from e
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise MediaError(
            f"media fetch failed ({type(e).__name__}: {e})", code=MEDIA_FETCH_FAILED
        ) from e


def _read(
    resp: http.client.HTTPResponse, sock: socket.socket, policy: FetchPolicy, deadline: float
) -> bytes:
    try:
        length = resp.getheader("Content-Length")
        if length is not None and length.isdigit() and int(length) > policy.max_bytes:
            raise MediaError(
                f"media of {length} bytes exceeds the limit of {policy.max_bytes} bytes",
                code=MEDIA_BUDGET_EXCEEDED,
            )
        chunks: list[bytes] = []
        total = 0
        while True:
            if not resp.isclosed():  # (a complete body closes the socket)
                sock.settimeout(_remaining(deadline))  # no read may outlive the deadline
            chunk = resp.read1(_CHUNK)  # one socket read: the deadline check runs between
            _remaining(deadline)
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > policy.max_bytes:
                raise MediaError(
                    f"media exceeds the limit of {policy.max_bytes} bytes",
                    code=MEDIA_BUDGET_EXCEEDED,
                )
            chunks.append(chunk)
    finally:
        resp.close()
