"""SSE streams open as soon as the engine accepts a request and keep alive while it is held.

The scripted server runs one lane with a short keep-alive interval (the 5 s default is a
ServerConfig field). A long stream holds the lane, so the streams behind it are genuinely
waiting; the scripted runner holds every prefill for a second, so admitted streams are genuinely
prefilling. Nothing here sleeps: every wait is a blocking read of the next SSE line. A stream
that waits past its queue deadline gets its error in band, after the headers.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from e2e.serve_process import MODEL_ID, ServeProcess, serve, sse_events

pytestmark = pytest.mark.e2e
KEEPALIVE = ": keep-alive"
CHAT, MESSAGES, RESPONSES = "/v1/chat/completions", "/v1/messages", "/v1/responses"


def _ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


BODIES = {
    CHAT: {"model": MODEL_ID, "messages": _ask("REASON"), "stream": True, "return_progress": True},
    MESSAGES: {"model": MODEL_ID, "messages": _ask("REASON"), "stream": True, "max_tokens": 100},
    RESPONSES: {"model": MODEL_ID, "input": "REASON", "stream": True},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServeProcess]:
    log = tmp_path_factory.mktemp("keepalive") / "requests.jsonl"
    args = ("--max-concurrency", "1", "--max-pending-requests", "4", "--step-delay", "0.01",
            "--first-token-delay", "1.0", "--keepalive-ms", "150",
            "--request-log-jsonl", str(log))  # fmt: skip
    with serve(*args, scripted=True) as s:
        s.request_log = log  # type: ignore[attr-defined]
        yield s


def open_stream(server: ServeProcess, path: str, body: dict[str, Any]):  # noqa: ANN201
    conn = server.connection(timeout=60)
    conn.request("POST", path, body=json.dumps(body), headers={"content-type": "application/json"})
    resp = conn.getresponse()  # returns once the status line and headers arrived
    return conn, resp


def request_id(resp: http.client.HTTPResponse) -> str:
    return resp.getheader("x-request-id") or resp.getheader("request-id") or ""


def terminals(server: ServeProcess, ids: list[str]) -> list[dict[str, Any]]:
    """The JSONL terminal record of each request, in `ids` order, once each has settled."""
    for rid in ids:
        server.settled(rid)
    records = [json.loads(x) for x in server.request_log.read_text().splitlines()]
    by_id = {r["request_id"]: r for r in records if r["event"].startswith("request_")
             and r["event"] not in ("request_start", "request_scheduling")}  # fmt: skip
    return [by_id[rid] for rid in ids]


def until_keepalive(lines: Iterator[str]) -> list[str]:
    """The lines before the first keep-alive comment."""
    before = []
    for line in lines:
        if line == KEEPALIVE:
            return before
        before.append(line)
    raise AssertionError(f"the stream ended without a keep-alive: {before}")


def data(line: str) -> dict[str, Any]:
    return json.loads(line.removeprefix("data: "))


def test_headers_at_acceptance_and_keep_alive_while_waiting_and_prefilling(server) -> None:
    blocker, blocker_resp = open_stream(
        server, CHAT, {"model": MODEL_ID, "messages": _ask("LONG"), "stream": True}
    )
    blocker_lines = sse_events(blocker_resp)
    while "reasoning_content" not in next(blocker_lines):  # the only lane is decoding
        pass
    queued, ids = {}, [request_id(blocker_resp)]
    for path, body in BODIES.items():
        conn, resp = open_stream(server, path, body)
        # headers arrived although the request cannot be admitted while the blocker runs
        assert resp.status == 200 and resp.getheader("content-type") == "text/event-stream"
        lines = sse_events(resp)
        opening = until_keepalive(lines)  # then a keep-alive while it waits in the queue
        queued[path] = (conn, lines, opening)
        ids.append(request_id(resp))
    # only each protocol's opening frames came before the first keep-alive: no model output
    assert [data(x)["choices"][0]["delta"] for x in queued[CHAT][2]] == [
        {"role": "assistant", "content": ""}
    ]
    assert queued[MESSAGES][2] == []
    assert [x for x in queued[RESPONSES][2] if x.startswith("event:")] == [
        "event: response.created",
        "event: response.in_progress",
    ]
    blocker.close()  # cancels the blocker: the queued streams run one by one

    chat_lines = list(queued[CHAT][1])
    progress = [i for i, x in enumerate(chat_lines) if "prompt_progress" in x]
    alive = [i for i, x in enumerate(chat_lines) if x == KEEPALIVE]
    first_delta = next(i for i, x in enumerate(chat_lines) if "reasoning_content" in x)
    # admitted (progress 0 of N), kept alive through the held prefill, then progress N of N
    assert data(chat_lines[progress[0]])["prompt_progress"]["processed"] == 0
    assert any(progress[0] < i < progress[-1] for i in alive)
    assert progress[-1] < first_delta and chat_lines[-1] == "data: [DONE]"
    deltas = [data(x)["choices"][0]["delta"] for x in chat_lines if x.startswith("data: {")]
    assert "".join(d.get("content") or "" for d in deltas) == "The answer is 42."

    message_lines = list(queued[MESSAGES][1])
    names = [x.removeprefix("event: ") for x in message_lines if x.startswith("event: ")]
    start = message_lines.index("event: message_start")
    block = message_lines.index("event: content_block_start")
    assert any(x == KEEPALIVE for x in message_lines[start:block])  # prefilling, kept alive
    assert names[0] == "message_start" and names[-1] == "message_stop"
    texts = [data(x)["delta"].get("text", "") for x in message_lines if "text_delta" in x]
    assert "".join(texts) == "The answer is 42."

    response_lines = list(queued[RESPONSES][1])
    final = data(response_lines[-1])
    assert final["type"] == "response.completed"
    assert final["response"]["output"][-1]["content"][0]["text"] == "The answer is 42."

    done = terminals(server, ids)
    assert [r["event"] for r in done] == ["request_done"] * 4
    assert [r["delivery"] for r in done] == ["client_gone", "delivered", "delivered", "delivered"]
    assert done[0]["finish_reason"] == "cancelled"


def test_sdks_read_through_keep_alive_comments(server) -> None:
    """Every stream here is kept alive during its held prefill; the SDKs must not mind."""
    chat = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
    text = ""
    for chunk in chat.chat.completions.create(model=MODEL_ID, messages=_ask("REASON"), stream=True):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    assert text == "The answer is 42."
    with chat.responses.stream(model=MODEL_ID, input="REASON") as stream:
        final = stream.get_final_response()
    assert final.output_text == "The answer is 42."
    messages = anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)
    with messages.messages.stream(model=MODEL_ID, max_tokens=100, messages=_ask("REASON")) as s:
        message = s.get_final_message()
    assert message.content[-1].text == "The answer is 42."


@pytest.fixture(scope="module")
def impatient(tmp_path_factory) -> Iterator[ServeProcess]:
    log = tmp_path_factory.mktemp("impatient") / "requests.jsonl"
    args = ("--max-concurrency", "1", "--step-delay", "0.01", "--pending-timeout-ms", "600",
            "--keepalive-ms", "100", "--delivery-timeout-ms", "1000",
            "--request-log-jsonl", str(log))  # fmt: skip
    with serve(*args, scripted=True) as s:
        s.request_log = log  # type: ignore[attr-defined]
        yield s


def test_queue_timeout_after_the_headers_is_reported_in_band(impatient) -> None:
    blocker, blocker_resp = open_stream(
        impatient, CHAT, {"model": MODEL_ID, "messages": _ask("LONG"), "stream": True}
    )
    blocker_lines = sse_events(blocker_resp)
    while "reasoning_content" not in next(blocker_lines):
        pass
    ends, ids = {}, []
    for path, body in BODIES.items():
        conn, resp = open_stream(impatient, path, body)
        assert resp.status == 200  # accepted: the stream is open while it waits
        ends[path] = list(sse_events(resp))
        ids.append(request_id(resp))
        conn.close()
    blocker.close()
    chat_error = data(ends[CHAT][-1])["error"]
    assert chat_error["code"] == "request_queue_timeout" and KEEPALIVE in ends[CHAT]
    assert ends[MESSAGES][-2] == "event: error"
    assert data(ends[MESSAGES][-1])["error"]["type"] == "timeout_error"  # 504
    failed = data(ends[RESPONSES][-1])
    assert failed["type"] == "response.failed"
    assert failed["response"]["error"]["code"] == "request_queue_timeout"
    errors = terminals(impatient, ids)
    assert [e["event"] for e in errors] == ["request_error"] * 3
    assert {e["phase"] for e in errors} == {"queue"}
    assert [e["status"] for e in errors] == [503, 504, 503]  # Anthropic's queue timeout is 504
    for rid in ids:
        line = impatient.settled(rid)
        assert " WARNING " in line and "code=request_queue_timeout" in line
    assert "Traceback" not in "\n".join(impatient.log)


def test_a_client_that_stops_reading_is_client_gone_not_200(impatient) -> None:
    """The client reads the headers, then nothing: its TCP window closes and the rest of the
    stream stays unsent, although it would fit in the kernel's buffers."""
    body = json.dumps({"model": MODEL_ID, "messages": _ask("LONG"), "stream": True,
                       "max_tokens": 200}).encode()  # fmt: skip
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", impatient.port))
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    sock.sendall(head + body)
    received = b""
    while b"\r\n\r\n" not in received:
        received += sock.recv(256)
    headers = received.split(b"\r\n\r\n")[0].decode().lower().splitlines()
    (rid,) = [h.split(": ", 1)[1] for h in headers if h.startswith("x-request-id: ")]
    try:
        line = impatient.settled(rid)  # the server gives up on the client; we never read again
    finally:
        sock.close()
    assert "status=499 delivery=client_gone finish=length" in line and "status=200" not in line
    (done,) = terminals(impatient, [rid])
    assert done["delivery"] == "client_gone" and done["status"] == 499
    assert len(done["result"]["generated_token_ids"]) == 200  # the engine finished its work


def test_scraping_metrics_while_eight_streams_decode_changes_no_output() -> None:
    """Eight lanes decode scripted (exactly known) outputs while /metrics is scraped in a loop.
    Latency is printed for the record (docs/serving.md); only a generous sanity bound is
    asserted here, since speed targets live in benchmarks."""
    import threading
    import time

    args = ("--max-concurrency", "8", "--step-delay", "0.02")
    with serve(*args, scripted=True) as server:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        outputs: dict[int, str] = {}
        barrier = threading.Barrier(9)

        def stream(i: int) -> None:
            barrier.wait()
            text = ""
            for chunk in client.chat.completions.create(
                model=MODEL_ID, messages=_ask(f"You are client-{i}."), stream=True
            ):
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
            outputs[i] = text

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        barrier.wait()
        latencies, widest = [], 0
        conn = server.connection()
        while any(t.is_alive() for t in threads):
            t0 = time.perf_counter()
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
            latencies.append(time.perf_counter() - t0)
            for line in text.splitlines():
                if line.startswith("ninfer_requests_decode_ready "):
                    widest = max(widest, int(float(line.split()[1])))
        for t in threads:
            t.join()
    assert outputs == {i: " ".join([f"client-{i}"] * 12) for i in range(8)}
    assert widest == 8  # scrapes ran while all eight decoded together
    latencies.sort()
    print(
        f"/metrics during 8-stream decode: {len(latencies)} scrapes, "
        f"median {latencies[len(latencies) // 2] * 1e3:.2f} ms, max {latencies[-1] * 1e3:.2f} ms"
    )
    assert latencies[-1] < 2.0  # a sanity bound only
