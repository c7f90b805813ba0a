"""Anthropic routes: POST /v1/messages (aggregate and SSE) and /v1/messages/count_tokens.

Glue over `protocol.anthropic*` and `Engine.achat`. A stream's headers wait for admission, so
overload (529), queue timeout (504) and prompt errors stay plain HTTP errors and message_start
knows the exact prompt/cache split. Errors use Anthropic's envelope with `request_id`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from sanic import Request, response
from sanic.response import HTTPResponse

from ninfer.api import ChatEvent, Engine
from ninfer.protocol.anthropic import MessagesRequest, parse_messages_request
from ninfer.protocol.anthropic_render import (
    BlockAssembler,
    Event,
    MessageRenderer,
    MessageUsage,
    error_body,
    new_message_id,
    stop_reason,
)
from ninfer.protocol.errors import SERVER, ProtocolError
from ninfer.server import sse
from ninfer.server.config import ServerConfig
from ninfer.server.errors import to_protocol_error
from ninfer.server.openai_routes import read_json

log = logging.getLogger("ninfer.server")
ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
# Engine error code -> Anthropic HTTP status (spec: overload is 529, queue/media timeouts 504).
STATUS_BY_CODE = {"server_overloaded": 529, "request_queue_timeout": 504}


def is_anthropic_path(path: str) -> bool:
    return path in ANTHROPIC_PATHS


def anthropic_error(exc: BaseException) -> ProtocolError:
    """The ProtocolError for `exc`, with Anthropic's statuses for overload and queue timeout."""
    error = to_protocol_error(exc)
    status = STATUS_BY_CODE.get(error.code or "")
    if status is None:
        return error
    return ProtocolError(error.message, status=status, code=error.code, type=SERVER)


def event_frame(event: Event) -> bytes:
    name, data = event
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {payload}\n\n".encode()


class AnthropicRoutes:
    def __init__(self, engine: Engine, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config

    def _parse(self, request: Request, *, count_only: bool) -> tuple[MessagesRequest, dict]:
        parsed = parse_messages_request(
            read_json(request),
            default_max_tokens=self.config.default_max_tokens,
            count_only=count_only,
        )
        kwargs = parsed.render_kwargs(
            default_thinking=not self.config.no_thinking,
            default_preserve=self.config.preserve_thinking,
        )
        return parsed, kwargs

    async def count_tokens(self, request: Request) -> HTTPResponse:
        parsed, kwargs = self._parse(request, count_only=True)
        ids = await asyncio.to_thread(self.engine.render, parsed.messages, parsed.tools, **kwargs)
        return response.json({"input_tokens": len(ids)})

    async def messages(self, request: Request) -> HTTPResponse | None:
        parsed, kwargs = self._parse(request, count_only=False)
        run = _MessageRun(request.ctx.request_id, parsed)
        enable_thinking = kwargs.pop("enable_thinking")
        events = self.engine.achat(
            parsed.messages,
            parsed.tools,
            enable_thinking=enable_thinking,
            template_kwargs=kwargs,
            max_tokens=parsed.max_tokens,
            stop=parsed.stop,
            request_id=run.request_id,
            thinking_budget=parsed.budget_tokens,
            cache_marks=parsed.cache_marks,
            cache_implicit=False,  # Anthropic caches at explicit cache_control markers only
            **parsed.sampling,
        )
        return await sse.serve_events(
            events,
            self.config.keepalive_s,
            stream=parsed.stream,
            on_stream=lambda first, source: self._stream(request, run, first, source),
            on_aggregate=lambda first, source: self._aggregate(run, first, source),
            on_disconnect=lambda: run.log(499, code="client_disconnected"),
        )

    async def _aggregate(
        self, run: _MessageRun, first: ChatEvent | None, source: AsyncIterator[ChatEvent | None]
    ) -> HTTPResponse:
        event = first
        while event is not None:
            run.events(event)
            if event.kind == "finished":
                break
            event = await sse.next_event(source)
        run.blocks.close()
        run.log(200)
        return response.json(
            run.body(), ensure_ascii=False, headers=sse.prefix_headers(run.finished, first)
        )

    async def _stream(
        self,
        request: Request,
        run: _MessageRun,
        first: ChatEvent | None,
        source: AsyncIterator[ChatEvent | None],
    ) -> None:
        stream = await request.respond(
            content_type="text/event-stream",
            headers={"cache-control": "no-cache", **sse.prefix_headers(first)},
        )
        assert stream is not None
        try:
            event: Any = first
            while event is not sse.END:
                if event is None:  # idle heartbeat
                    await stream.send(sse.KEEPALIVE)
                else:
                    for item in run.events(event):
                        await stream.send(event_frame(item))
                    if event.kind == "finished":
                        break
                event = await anext(source, sse.END)
        except Exception as exc:  # after headers: report in-band, then end the stream
            error = anthropic_error(exc)
            run.log(error.status, code=error.code)
            await stream.send(event_frame(("error", error_body(error, run.request_id))))
            await stream.eof()
            return
        await stream.eof()
        run.log(200)


class _MessageRun:
    """One message's blocks, usage and stop state; yields the SSE events of each engine event."""

    def __init__(self, request_id: str, parsed: MessagesRequest) -> None:
        self.request_id = request_id
        self.parsed = parsed
        self.renderer = MessageRenderer(new_message_id(), parsed.model)
        self.blocks = BlockAssembler()
        self.started = False
        self.finished: ChatEvent | None = None
        self.num_prompt = 0
        self.num_cached = 0
        self.num_output = 0
        self.t_start = time.monotonic()

    def events(self, event: ChatEvent) -> list[Event]:
        out: list[Event] = []
        if event.kind in ("admitted", "progress"):
            self.num_prompt = event.num_prompt
            if event.kind == "admitted":
                self.num_cached = event.num_cached
        if not self.started:  # message_start right after admission (exact cache split)
            self.started = True
            out += [self.renderer.start(self.usage()), self.renderer.ping()]
        if event.kind in ("admitted", "progress"):
            return out
        self.num_output = max(self.num_output, event.num_output)
        if event.kind == "reasoning":
            out += self.blocks.thinking(event.text)
        elif event.kind == "content":
            out += self.blocks.text(event.text)
        elif event.kind == "tool_call":
            assert event.tool_call is not None
            out += self.blocks.tool_use(event.tool_call)
        elif event.kind == "finished":
            self.finished = event
            out += self.blocks.close()
            out.append(self.renderer.delta(self.stop_reason, self.stop_sequence, self.usage()))
            out.append(self.renderer.stop())
        return out

    @property
    def stop_sequence(self) -> str | None:
        return self.finished.stop_sequence if self.finished is not None else None

    @property
    def stop_reason(self) -> str:
        reason = self.finished.finish_reason if self.finished is not None else None
        return stop_reason(
            reason.value if reason is not None else "stop",
            stop_sequence=self.stop_sequence,
            has_tool_use=self.blocks.has_tool_use,
        )

    def usage(self) -> MessageUsage:
        usage = self.finished.usage if self.finished is not None else None
        if usage is None:  # message_start: admission already fixed the cached split
            return MessageUsage(self.num_prompt - self.num_cached, self.num_output, self.num_cached)
        return MessageUsage(
            usage.prompt_tokens - usage.cached_tokens,
            usage.completion_tokens,
            usage.cached_tokens,
            usage.cache_creation_tokens,
        )

    def body(self) -> dict[str, Any]:
        return self.renderer.message(
            self.blocks.blocks,
            stop_reason=self.stop_reason,
            stop_sequence=self.stop_sequence,
            usage=self.usage(),
        )

    def log(self, status: int, *, code: str | None = None) -> None:
        elapsed_ms = (time.monotonic() - self.t_start) * 1000.0
        kind = "stream" if self.parsed.stream else "aggregate"
        if code is not None:
            log.warning(
                "request %s messages %s status=%d code=%s elapsed=%.0fms",
                self.request_id, kind, status, code, elapsed_ms,
            )  # fmt: skip
            return
        u = self.usage()
        log.info(
            "request %s messages %s status=%d stop=%s input=%d cache_read=%d output=%d "
            "elapsed=%.0fms",
            self.request_id, kind, status, self.stop_reason, u.input_tokens,
            u.cache_read_input_tokens, u.output_tokens, elapsed_ms,
        )  # fmt: skip
