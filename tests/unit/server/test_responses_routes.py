"""Responses routes over a fake engine: in-band `response.failed`, and store-before-terminal.

These are the paths a live scripted model cannot reach: an engine failure after the stream's
headers, and a Response that outgrows the store only once its output exists. The routes run
through the real Lifecycle; the fake request collects what it would write.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from ninfer.api import ChatEvent, ChatUsage
from ninfer.engine.errors import EngineFailed
from ninfer.engine.request import FinishReason
from ninfer.server.config import ServerConfig
from ninfer.server.lifecycle import Observability
from ninfer.server.metrics import ServerMetrics
from ninfer.server.request_log import RequestLog
from ninfer.server.responses_routes import ResponsesRoutes


class FakeEngine:
    model_id = "m"
    default_thinking_budget = None

    def __init__(self, events: list[ChatEvent], fail: Exception | None = None) -> None:
        self.events = events
        self.fail = fail

    async def achat(self, *args: Any, **kwargs: Any) -> AsyncIterator[ChatEvent]:
        yield ChatEvent("submitted", request_id=kwargs["request_id"], num_prompt=4)
        for event in self.events:
            yield event
        if self.fail is not None:
            raise self.fail


def routes_for(engine: FakeEngine, config: ServerConfig | None = None) -> ResponsesRoutes:
    config = config or ServerConfig()
    hub = Observability(engine, config, RequestLog(None), ServerMetrics())
    return ResponsesRoutes(engine, config, hub)


class FakeStream:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.closed = False
        self.content_type: str | None = None

    async def send(self, data: bytes = b"", end_stream: bool = False) -> None:
        self.chunks.append(data)
        self.closed = self.closed or end_stream

    async def eof(self) -> None:
        self.closed = True


def fake_request(body: dict[str, Any], stream: FakeStream) -> Any:
    async def respond(**kwargs: Any) -> FakeStream:
        stream.content_type = kwargs.get("content_type")
        return stream

    raw = json.dumps(body).encode()
    return SimpleNamespace(body=raw, ctx=SimpleNamespace(request_id="req-1"), respond=respond)


def parse(stream: FakeStream) -> list[dict[str, Any]]:
    events = []
    for frame in b"".join(stream.chunks).decode().split("\n\n"):
        if not frame.strip():
            continue
        name, data = frame.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == "event: " + event["type"]
        events.append(event)
    return events


def text_events(text: str) -> list[ChatEvent]:
    return [
        ChatEvent("admitted", num_prompt=4),
        ChatEvent("content", text=text, token_ids=[1], num_output=1),
    ]


FINISHED = ChatEvent("finished", finish_reason=FinishReason.STOP, usage=ChatUsage(4, 1))


def test_engine_failure_after_headers_ends_with_response_failed() -> None:
    routes = routes_for(FakeEngine(text_events("part"), EngineFailed("boom")), ServerConfig())
    stream = FakeStream()
    request = fake_request({"model": "m", "input": "hi", "stream": True}, stream)
    assert asyncio.run(routes.create(request)) is None
    events = parse(stream)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.failed"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["completed_at"] is None
    assert failed["error"] == {"code": "engine_failure", "message": "engine failure"}
    (item,) = failed["output"]  # the interrupted Item keeps the text already streamed
    assert item["status"] == "incomplete" and item["content"][0]["text"] == "part"
    assert stream.closed and len(routes.store) == 0


def test_store_overflow_after_generation_fails_instead_of_pretending() -> None:
    config = ServerConfig(response_store_max_mib=1)
    big = "x" * (1 << 20)  # the output alone outgrows the 1 MiB store
    routes = routes_for(FakeEngine([*text_events(big), FINISHED]), config)
    stream = FakeStream()
    asyncio.run(routes.create(fake_request({"model": "m", "input": "hi", "stream": True}, stream)))
    events = parse(stream)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "response_store_capacity_exceeded"
    assert "response.completed" not in [e["type"] for e in events]
    assert len(routes.store) == 0

    aggregate = routes_for(FakeEngine([*text_events(big), FINISHED]), config)
    with pytest.raises(Exception) as info:
        asyncio.run(aggregate.create(fake_request({"model": "m", "input": "hi"}, FakeStream())))
    assert getattr(info.value, "code", None) == "response_store_capacity_exceeded"
    # store:false never needs the store
    unstored = routes_for(FakeEngine([*text_events(big), FINISHED]), config)
    written = FakeStream()
    body = {"model": "m", "input": "hi", "store": False}
    asyncio.run(unstored.create(fake_request(body, written)))
    assert written.content_type == "application/json" and written.closed
    assert json.loads(b"".join(written.chunks))["status"] == "completed"


def test_stored_before_the_terminal_event() -> None:
    seen: list[int] = []

    class WatchingStream(FakeStream):
        async def send(self, data: bytes = b"", end_stream: bool = False) -> None:
            if b"response.completed" in data.split(b"\n", 1)[0]:
                seen.append(len(routes.store))
            await super().send(data, end_stream)

    routes = routes_for(FakeEngine([*text_events("ok"), FINISHED]), ServerConfig())
    stream = WatchingStream()
    asyncio.run(routes.create(fake_request({"model": "m", "input": "hi", "stream": True}, stream)))
    assert seen == [1]
    final = parse(stream)[-1]["response"]
    assert routes.store.get(final["id"]).response == final
    assert final["output"][0]["content"][0]["text"] == "ok" and final["usage"]["input_tokens"] == 4
