"""A body at --max-request-mib must not stall the server: /health and a running stream keep
answering while it is decoded, validated, rendered and tokenized.

The stream comes from the scripted model (one token per 20 ms step); the large request is an
Anthropic count_tokens body at the limit, whose tokenization takes seconds on any CPU. The test
asserts ordering and proportion, not absolute times: health checks are answered between the
large request's last byte and its response, and no pause in the stream is more than a fraction
of that request's own duration (before the fix the event loop stopped for most of it).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from e2e.serve_process import MODEL_ID, ServeProcess, serve, sse_events

pytestmark = pytest.mark.e2e
LIMIT_MIB = 8


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    with serve("--max-request-mib", str(LIMIT_MIB), "--step-delay", "0.02", scripted=True) as s:
        yield s


def body_at_limit() -> bytes:
    """A count_tokens body of exactly --max-request-mib bytes: plain text needing no escapes."""
    head = f'{{"model": "{MODEL_ID}", "messages": [{{"role": "user", "content": "'.encode()
    tail = b'"}]}'
    sentence = b"The quick brown fox jumps over the lazy dog; the tokenizer counts words. "
    room = LIMIT_MIB * 2**20 - len(head) - len(tail)
    raw = head + (sentence * (room // len(sentence) + 1))[:room] + tail
    assert len(raw) == LIMIT_MIB * 2**20 and json.loads(raw)["model"] == MODEL_ID
    return raw


def test_body_at_the_limit_is_accepted_and_over_it_is_413(server: ServeProcess) -> None:
    raw = body_at_limit()
    status, _, payload = server.request("POST", "/v1/messages/count_tokens", raw=raw)
    assert status == 200 and payload["input_tokens"] > LIMIT_MIB * 2**20 // 8
    # One byte more: refused from Content-Length alone, before the body is read or parsed.
    conn = server.connection()
    conn.putrequest("POST", "/v1/messages/count_tokens")
    conn.putheader("content-type", "application/json")
    conn.putheader("content-length", str(len(raw) + 1))
    conn.endheaders()
    response = conn.getresponse()
    assert response.status == 413
    assert json.loads(response.read())["error"]["code"] == "request_too_large"
    conn.close()


def test_health_and_streams_keep_answering_during_a_large_body(server: ServeProcess) -> None:
    stream = server.connection(timeout=120)
    chat = {"model": MODEL_ID, "messages": [{"role": "user", "content": "LONG"}], "stream": True}
    stream.request("POST", "/v1/chat/completions", body=json.dumps(chat),
                   headers={"content-type": "application/json"})  # fmt: skip
    lines = sse_events(stream.getresponse())
    while '"content"' not in next(lines):  # the stream is producing content
        pass

    raw = body_at_limit()
    marks: dict[str, float] = {}
    result: dict[str, int] = {}

    def post_large() -> None:
        conn = server.connection(timeout=600)
        conn.putrequest("POST", "/v1/messages/count_tokens")
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", str(len(raw)))
        conn.endheaders()
        conn.send(raw)
        marks["sent"] = time.monotonic()
        response = conn.getresponse()
        response.read()
        result["status"] = response.status
        marks["done"] = time.monotonic()
        conn.close()

    worker = threading.Thread(target=post_large)
    worker.start()
    health: list[float] = []
    chunks: list[float] = []
    while worker.is_alive():
        status, _, body = server.request("GET", "/health")
        assert (status, body) == (200, {"status": "ok"})
        health.append(time.monotonic())
        for _ in range(3):
            while not next(lines).startswith("data:"):  # `: keep-alive` after 5 s of silence
                pass
            chunks.append(time.monotonic())
    worker.join()
    stream.close()
    assert result["status"] == 200
    sent, done = marks["sent"], marks["done"]
    during = [t for t in chunks if sent <= t <= done]
    # Ordering: the server answered /health and streamed while the large body was in flight.
    assert sum(sent <= t <= done for t in health) >= 3
    assert len(during) >= 10
    # Proportion: no stall of the stream took a large share of the large request's own time
    # (the whole-text tokenizer call used to freeze the event loop for most of it).
    points = [sent, *during, done]
    longest = max(b - a for a, b in zip(points, points[1:], strict=False))
    assert longest < 0.25 * (done - sent), (longest, done - sent)
