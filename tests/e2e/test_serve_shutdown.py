"""Stopping a live `ninfer serve` with requests in flight, through the official SDKs.

The drain lets what is in flight finish for the HTTP server's graceful timeout less a margin;
what is left then must end cleanly: a stream with the protocol's own in-band error and an
aggregate request with a 503, each `server_stopping`, never a connection cut mid-body. The
graceful timeout is shortened through Sanic's own environment variable so the test does not wait
the default 15 s; the requests ask for far more tokens than the demo makes in that time.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from e2e.serve_process import MODEL_ID, serve
from ninfer.server.request_log import SCHEMA_PATH

pytestmark = pytest.mark.e2e
HELLO = [{"role": "user", "content": "hello"}]
LONG = 20_000  # output tokens: minutes on the demo, far past the drain


def _first_chunks_then(stream: Any, started: threading.Event, n: int = 3) -> int:
    seen = 0
    for _ in stream:
        seen += 1
        if seen == n:
            started.set()
    return seen


def _client_thread(
    outcomes: dict[str, Any], key: str, error: type[Exception], call: Callable[[], None]
) -> threading.Thread:
    """A thread running one client call: its outcome under `key`, "completed" or the SDK error."""

    def run() -> None:
        try:
            call()
            outcomes[key] = "completed"
        except error as e:
            outcomes[key] = e

    return threading.Thread(target=run)


def _wait_until_waiting(server: Any, n: int, timeout_s: float = 30.0) -> None:
    """Until /metrics shows `n` requests waiting for a lane (the engine took the request)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, _, text = server.request("GET", "/metrics")
        if f"ninfer_requests_waiting {float(n)}" in text:
            return
        time.sleep(0.02)
    raise AssertionError(f"no {n} waiting requests in {timeout_s} s")


def test_requests_left_at_the_end_of_the_drain_end_with_server_stopping(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.setenv("SANIC_GRACEFUL_SHUTDOWN_TIMEOUT", "4")  # the drain: 4 - 2 s
    jsonl = tmp_path / "requests.jsonl"
    args = ("--max-concurrency", "2", "--max-context", "30000", "--request-log-jsonl", str(jsonl))
    with serve(*args) as server:
        oa = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        an = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
        outcomes: dict[str, Any] = {}
        started = [threading.Event(), threading.Event()]

        def openai_stream() -> None:
            stream = oa.chat.completions.create(
                model=MODEL_ID, messages=HELLO, max_tokens=LONG, stream=True
            )
            _first_chunks_then(stream, started[0])

        def anthropic_stream() -> None:
            stream = an.messages.create(
                model=MODEL_ID, max_tokens=LONG, messages=HELLO, stream=True
            )
            _first_chunks_then(stream, started[1])

        def openai_waiting() -> None:  # both lanes are busy: it waits for admission
            oa.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=LONG)

        threads = [
            _client_thread(outcomes, "openai_stream", openai.APIError, openai_stream),
            _client_thread(
                outcomes, "anthropic_stream", anthropic.APIStatusError, anthropic_stream
            ),
        ]
        for t in threads:
            t.start()
        for event in started:
            assert event.wait(60)
        waiting = _client_thread(outcomes, "openai_waiting", openai.APIStatusError, openai_waiting)
        waiting.start()
        _wait_until_waiting(server, 1)
        server.proc.send_signal(signal.SIGINT)
        for t in [*threads, waiting]:
            t.join(60)
            assert not t.is_alive()
        assert server.proc.wait(timeout=60) == 0
        server.wait_for_log("shutdown drain:")  # reads the stderr lines up to the drain's count

    stream_error = outcomes["openai_stream"]
    assert isinstance(stream_error, openai.APIError), stream_error
    assert stream_error.body["code"] == "server_stopping"  # in band, after the stream began
    anthropic_error = outcomes["anthropic_stream"]
    assert isinstance(anthropic_error, anthropic.APIStatusError), anthropic_error
    assert anthropic_error.body["error"]["code"] == "server_stopping"
    waited = outcomes["openai_waiting"]
    assert isinstance(waited, openai.APIStatusError) and waited.status_code == 503
    assert waited.code == "server_stopping"
    log = "\n".join(server.log)
    assert "shutdown: ending 3 requests still in flight" in log
    assert log.count("code=server_stopping") == 3 and "Traceback" not in log
    assert "0 unsettled" in log
    # each one terminal record, valid against the log's schema, naming the code it was given
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    for record in records:
        validator.validate(record)
    done = [r for r in records if r["event"] == "request_done"]
    assert len(done) == 3 and all(r["finish_reason"] == "cancelled" for r in done)
    assert all(r["response_failure"] == "server_stopping" and r["status"] == 503 for r in done)
