"""The request Lifecycle over a fake engine and a fake HTTP response: the cases a live server
reaches only by timing.

The fake engine releases events only when a test says so, so "the request is still waiting" is a
fact, not a sleep. Every case checks the terminal: one JSONL record per request (validated
against the published schema), one operational line and the outcome counter.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest

from ninfer.api import ChatEvent, ChatUsage
from ninfer.engine.errors import QueueTimeout, ServerOverloaded
from ninfer.engine.request import FinishReason, RequestStats
from ninfer.protocol.errors import ProtocolError
from ninfer.server.config import ServerConfig
from ninfer.server.errors import to_protocol_error
from ninfer.server.lifecycle import Observability, RequestShape
from ninfer.server.metrics import ServerMetrics
from ninfer.server.request_log import SCHEMA_PATH, RequestLog
from ninfer.server.sse import KEEPALIVE

VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


class Engine:
    """Hands out one scripted event source; `cancel` ends it the way the engine would."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.cancelled: list[str] = []
        self.core = SimpleNamespace(cancel=self.cancel)
        self.output: list[int] = []

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)
        self.queue.put_nowait(finished(self.output, FinishReason.CANCELLED))

    async def events(self) -> AsyncIterator[ChatEvent]:
        while True:
            item = await self.queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.kind == "finished":
                return


def stats(output: list[int], *, terminal: bool) -> RequestStats:
    now = time.monotonic()  # events are made after the lifecycle started: stages are >= 0
    return RequestStats(
        t_submitted=now,
        t_admitted=now,
        t_first_token=now if output else None,
        t_last_token=now if output else None,
        t_finished=now if terminal else None,
        num_prefill_tokens=4,
        output_ids=tuple(output) if terminal else (),
        sampling={"seed": 3, "temperature": 0.0, "greedy": True} if terminal else {},
    )


def finished(output: list[int], reason: FinishReason = FinishReason.STOP) -> ChatEvent:
    return ChatEvent(
        "finished",
        finish_reason=reason,
        usage=ChatUsage(4, len(output)),
        stats=stats(output, terminal=True),
    )


SUBMITTED = ChatEvent("submitted", request_id="req-1", num_prompt=4)


def admitted() -> ChatEvent:
    return ChatEvent("admitted", num_prompt=4, stats=stats([], terminal=False))


class Wire:
    """A minimal wire: one `data:` frame per event kind, an [END] frame, an error frame."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.kinds: list[str] = []

    def error(self, exc: BaseException) -> ProtocolError:
        return to_protocol_error(exc)

    def open(self) -> list[bytes]:
        return []

    def feed(self, event: ChatEvent) -> list[bytes]:
        self.kinds.append(event.kind)
        return [f"data: {event.kind}\n\n".encode()] if self.stream else []

    def close(self) -> list[bytes]:
        return [b"data: [END]\n\n"]

    def failed(self, error: ProtocolError) -> list[bytes]:
        return [f"data: error {error.code}\n\n".encode()]

    def body(self) -> dict[str, Any]:
        return {"kinds": self.kinds}


class Response:
    """What request.respond() returns: records writes; `blocked` makes sends never finish."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.ended = False
        self.keepalive = asyncio.Event()
        self.blocked = False

    async def send(self, data: bytes = b"", end_stream: bool = False) -> None:
        if self.blocked:
            await asyncio.Event().wait()  # a client that stopped reading
        self.writes.append(data)
        self.ended = self.ended or end_stream
        if data == KEEPALIVE:
            self.keepalive.set()

    async def eof(self) -> None:
        self.ended = True


class Transport:
    def __init__(self) -> None:
        self.backlog = 0
        self.aborted = False

    def get_write_buffer_size(self) -> int:
        return self.backlog

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def make_request(response: Response, transport: Transport | None = None) -> Any:
    calls: list[dict] = []

    async def respond(**kwargs: Any) -> Response:
        calls.append(kwargs)
        return response

    return SimpleNamespace(
        ctx=SimpleNamespace(request_id="req-1"), respond=respond, transport=transport, calls=calls
    )


class Setup:
    def __init__(self, tmp_path, *, stream: bool, **config: Any) -> None:
        self.engine = Engine()
        self.log_path = tmp_path / "log.jsonl"
        self.hub = Observability(
            self.engine,
            ServerConfig(**config),
            RequestLog.open(self.log_path),
            ServerMetrics(),
        )
        shape = RequestShape("openai_chat", stream, 16, True, num_messages=1)
        self.lifecycle = self.hub.begin("req-1", shape)
        self.wire = Wire(stream)
        self.response = Response()
        self.transport = Transport()
        self.request = make_request(self.response, self.transport)

    def start(self) -> asyncio.Task:
        return asyncio.get_running_loop().create_task(
            self.lifecycle.run(self.request, self.engine.events(), self.wire)
        )

    def records(self) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.log_path.read_text().splitlines()]
        for line in lines:
            VALIDATOR.validate(line)
        return lines

    def events(self) -> list[str]:
        return [r["event"] for r in self.records()]


async def wait_for(event: asyncio.Event) -> None:
    await asyncio.wait_for(event.wait(), timeout=10)


def test_stream_keeps_alive_while_waiting_and_prefilling(tmp_path, caplog) -> None:
    async def main() -> Setup:
        s = Setup(tmp_path, stream=True, keepalive_s=0.02)
        task = s.start()
        s.engine.queue.put_nowait(SUBMITTED)
        await wait_for(s.response.keepalive)  # headers out, request still queued
        assert s.request.calls[0]["content_type"] == "text/event-stream"
        assert s.response.writes[0] == b""  # the headers' own (empty) write came first
        s.response.keepalive.clear()
        s.engine.queue.put_nowait(admitted())
        await wait_for(s.response.keepalive)  # admitted, prefill not done: still alive
        s.engine.output = [7, 8]
        s.engine.queue.put_nowait(ChatEvent("content", text="hi", num_output=2))
        s.engine.queue.put_nowait(finished([7, 8]))
        await task
        return s

    with caplog.at_level(logging.INFO, logger="ninfer.server"):
        s = asyncio.run(main())
    body = b"".join(s.response.writes)
    frames = [f for f in body.split(b"\n\n") if f]
    keepalives = [i for i, f in enumerate(frames) if f == KEEPALIVE.strip()]
    i_admitted = frames.index(b"data: admitted")
    assert keepalives[0] < i_admitted < keepalives[-1] < frames.index(b"data: content")
    assert frames[-1] == b"data: [END]" and s.response.ended
    assert s.events() == ["request_start", "request_done"]
    done = s.records()[-1]
    assert done["delivery"] == "delivered" and done["status"] == 200
    assert done["result"]["generated_token_ids"] == [7, 8]
    assert done["timings_seconds"]["total"] >= done["timings_seconds"]["ttft"] >= 0
    assert s.hub.metrics.requests["completed"] == 1 and s.hub.metrics.ttft.count == 1
    (line,) = [r.getMessage() for r in caplog.records if "req-1" in r.getMessage()]
    assert "status=200 delivery=delivered finish=stop" in line and "completion=2" in line


def test_slow_preparation_opens_the_stream_and_keeps_it_alive(tmp_path) -> None:
    async def main() -> Setup:
        s = Setup(tmp_path, stream=True, keepalive_s=0.02)
        task = s.start()
        await wait_for(s.response.keepalive)  # still rendering: no "submitted" yet
        assert s.request.calls and s.engine.cancelled == []
        for event in (SUBMITTED, admitted(), finished([4])):
            s.engine.queue.put_nowait(event)
        await task
        return s

    s = asyncio.run(main())
    assert s.events() == ["request_start", "request_done"]
    assert s.records()[-1]["timings_seconds"]["prepare"] >= 0.02


def test_a_preparation_failure_after_the_headers_is_in_band(tmp_path) -> None:
    async def main() -> Setup:
        s = Setup(tmp_path, stream=True, keepalive_s=0.02)
        task = s.start()
        await wait_for(s.response.keepalive)
        s.engine.queue.put_nowait(ServerOverloaded("full"))
        await task  # no exception: the stream is already open
        return s

    s = asyncio.run(main())
    assert s.response.writes[-1] == b"data: error server_overloaded\n\n" and s.response.ended
    (rejected,) = s.records()
    assert rejected["event"] == "request_rejected" and rejected["status"] == 429


def test_preparation_rejection_is_an_http_error_without_request_start(tmp_path) -> None:
    async def main() -> tuple[Setup, ProtocolError]:
        s = Setup(tmp_path, stream=True)
        task = s.start()
        s.engine.queue.put_nowait(ServerOverloaded("full"))
        with pytest.raises(ProtocolError) as info:
            await task
        return s, info.value

    s, error = asyncio.run(main())
    assert error.status == 429 and error.code == "server_overloaded"
    assert not s.request.calls  # no header was sent: the app writes the HTTP error
    assert s.request.ctx.outcome_logged  # and does not log the request a second time
    (rejected,) = s.records()
    assert rejected["event"] == "request_rejected" and rejected["status"] == 429
    assert rejected["phase"] == "prepare" and rejected["code"] == "server_overloaded"
    assert s.hub.metrics.requests == {"completed": 0, "cancelled": 0, "rejected": 1, "failed": 0}


def test_queue_timeout_after_headers_is_in_band_and_request_error(tmp_path) -> None:
    async def main() -> Setup:
        s = Setup(tmp_path, stream=True, keepalive_s=0.02)
        task = s.start()
        s.engine.queue.put_nowait(SUBMITTED)
        await wait_for(s.response.keepalive)
        s.engine.queue.put_nowait(QueueTimeout("late"))
        await task
        return s

    s = asyncio.run(main())
    assert s.response.writes[-1] == b"data: error request_queue_timeout\n\n" and s.response.ended
    assert s.events() == ["request_start", "request_error"]
    error = s.records()[-1]
    assert error["phase"] == "queue" and error["status"] == 503
    assert s.hub.metrics.requests["failed"] == 1 and s.hub.metrics.duration.count == 0


def test_aggregate_is_written_once_with_its_length(tmp_path) -> None:
    async def main() -> Setup:
        s = Setup(tmp_path, stream=False)
        task = s.start()
        for event in (SUBMITTED, admitted(), finished([5])):
            s.engine.queue.put_nowait(event)
        await task
        return s

    s = asyncio.run(main())
    assert s.request.calls == [{"content_type": "application/json"}]
    kinds = ["admitted", "finished"]  # "submitted" is the lifecycle's own
    assert json.loads(b"".join(s.response.writes)) == {"kinds": kinds}
    assert s.response.ended and s.events() == ["request_start", "request_done"]


def test_client_gone_cancels_the_engine_and_settles_on_its_outcome(tmp_path) -> None:
    async def main() -> Setup:
        s = Setup(tmp_path, stream=True)
        task = s.start()
        s.engine.output = [1, 2, 3]
        for event in (SUBMITTED, admitted(), ChatEvent("content", text="a", num_output=1)):
            s.engine.queue.put_nowait(event)
        while b"data: content\n\n" not in s.response.writes:
            await asyncio.sleep(0)  # let the handler write the first delta
        task.cancel()  # what Sanic does when the connection drops
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(s.lifecycle.reader, 10)  # the engine's outcome still arrives
        return s

    s = asyncio.run(main())
    assert s.engine.cancelled == ["req-1"]
    done = s.records()[-1]
    assert done["event"] == "request_done" and done["finish_reason"] == "cancelled"
    assert done["delivery"] == "client_gone" and done["status"] == 499
    assert done["result"]["generated_token_ids"] == [1, 2, 3]  # the engine's, not the client's
    assert s.hub.metrics.requests["cancelled"] == 1 and not s.hub.active


def test_a_client_that_stops_reading_is_client_gone(tmp_path) -> None:
    async def main() -> Setup:
        s = Setup(tmp_path, stream=True, delivery_timeout_s=0.05)
        task = s.start()
        s.engine.queue.put_nowait(SUBMITTED)
        s.engine.queue.put_nowait(admitted())
        while not s.response.writes:
            await asyncio.sleep(0)
        s.transport.backlog = 1 << 20  # the kernel is full: writes now wait for the client
        s.response.blocked = True
        s.engine.queue.put_nowait(ChatEvent("content", text="a", num_output=1))
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(s.lifecycle.reader, 10)
        return s

    s = asyncio.run(main())
    assert s.transport.aborted and s.engine.cancelled == ["req-1"]
    done = s.records()[-1]
    assert done["delivery"] == "client_gone" and done["status"] == 499


def test_unconfirmed_final_bytes_are_not_delivered(tmp_path) -> None:
    async def main() -> Setup:
        s = Setup(tmp_path, stream=False, delivery_timeout_s=0.05)
        s.transport.backlog = 100  # never drains: the client is not reading
        task = s.start()
        for event in (SUBMITTED, admitted(), finished([5, 6])):
            s.engine.queue.put_nowait(event)
        with pytest.raises(asyncio.CancelledError):
            await task
        return s

    s = asyncio.run(main())
    done = s.records()[-1]
    assert done["finish_reason"] == "stop" and done["delivery"] == "client_gone"
    assert s.hub.metrics.requests["completed"] == 1 and s.hub.metrics.response_failures == 1


def test_client_gone_during_preparation_is_a_rejection(tmp_path) -> None:
    async def main() -> Setup:
        s = Setup(tmp_path, stream=False)
        task = s.start()
        await asyncio.sleep(0)  # the reader is now waiting for the engine's first event
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(s.lifecycle.reader, 10)
        return s

    s = asyncio.run(main())
    (rejected,) = s.records()
    assert rejected["event"] == "request_rejected" and rejected["code"] == "client_disconnected"
    assert not s.engine.cancelled  # nothing reached the engine
