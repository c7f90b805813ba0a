"""`ninfer serve` transport rules: API key, CORS, body limit, overload, client disconnect."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import openai
import pytest

from e2e.serve_process import MODEL_ID, ServeProcess, serve, sse_events

pytestmark = pytest.mark.e2e

KEY = "local-secret"
CHAT = "/v1/chat/completions"
AUTH = {"authorization": f"Bearer {KEY}"}
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    args = ["--api-key", KEY, "--cors", "--max-request-mib", "1"]
    with serve(*args, "--max-concurrency", "1", "--max-pending-requests", "0") as s:
        yield s


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({}, 401),
        ({"authorization": "Bearer wrong"}, 401),
        ({"x-api-key": "local-secre"}, 401),
        (AUTH, 200),
        ({"authorization": f"bearer {KEY}"}, 200),
        ({"x-api-key": KEY}, 200),
    ],
    ids=["none", "wrong-bearer", "wrong-header", "bearer", "bearer-lowercase", "x-api-key"],
)
def test_api_key_guards_models(server: ServeProcess, headers: dict, status: int) -> None:
    got, out_headers, body = server.request("GET", "/v1/models", headers=headers)
    assert got == status
    assert out_headers["x-request-id"].startswith("req-")
    if status == 401:
        assert body["error"]["code"] == "invalid_api_key"


def test_health_and_preflight_need_no_key(server: ServeProcess) -> None:
    status, _, body = server.request("GET", "/health")
    assert (status, body) == (200, {"status": "ok"})
    status, headers, _ = server.request(
        "OPTIONS",
        CHAT,
        headers={
            "origin": "http://example.test",
            "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type",
        },
    )
    assert status == 204
    assert headers["access-control-allow-origin"] == "http://example.test"
    assert "POST" in headers["access-control-allow-methods"]
    assert headers["access-control-allow-headers"] == "authorization, content-type"


def test_cors_headers_on_normal_and_error_responses(server: ServeProcess) -> None:
    for headers in (AUTH, {}):
        _, out, _ = server.request("GET", "/v1/models", headers={**headers, "origin": "http://a.b"})
        assert out["access-control-allow-origin"] == "http://a.b"
        assert "x-request-id" in out["access-control-expose-headers"]


def test_body_over_limit_is_413_before_parsing(server: ServeProcess) -> None:
    raw = b"{" + b" " * (1024 * 1024 + 10)  # not even JSON: the size check comes first
    status, headers, body = server.request("POST", CHAT, headers=AUTH, raw=raw)
    assert status == 413
    assert body["error"]["code"] == "request_too_large"
    assert headers["x-request-id"].startswith("req-")


def test_overload_is_429_and_disconnect_frees_the_lane(server: ServeProcess) -> None:
    conn = server.connection()
    body = {"model": MODEL_ID, "messages": HELLO, "max_tokens": 400, "stream": True}
    conn.request("POST", CHAT, body=json.dumps(body), headers={**AUTH, "content-type": "x"})
    resp = conn.getresponse()
    assert resp.status == 200
    lines = sse_events(resp)
    while "reasoning_content" not in next(lines):  # the long request is now decoding
        pass
    status, _, err = server.request(
        "POST", CHAT, {"model": MODEL_ID, "messages": HELLO, "max_tokens": 1}, headers=AUTH
    )
    assert status == 429 and err["error"]["code"] == "server_overloaded"
    sdk = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.RateLimitError):
        sdk.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=1)

    conn.close()  # client disconnect: the server must cancel the engine request
    server.wait_for_log("delivery=client_gone")
    out = _retry_while_overloaded(
        lambda: sdk.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=2)
    )
    assert out.usage is not None and out.usage.completion_tokens == 2


def _retry_while_overloaded(call, attempts: int = 100):  # type: ignore[no-untyped-def]
    """The engine frees the lane on its next step after the cancel; allow it a moment."""
    for _ in range(attempts):
        try:
            return call()
        except openai.RateLimitError:
            time.sleep(0.05)
    raise AssertionError("the cancelled request never released its lane")
