"""Anthropic routes: POST /v1/messages (aggregate and SSE) and /v1/messages/count_tokens.

Glue over `protocol.anthropic*` and `Engine.achat`; the shared `Lifecycle` owns clocks,
keep-alive, delivery and the terminal record. Overload (529) and prompt errors stay plain HTTP
errors; a stream's headers go out once the engine accepts the request, so a later queue timeout
(504) arrives as an `error` event. message_start follows admission, which knows the exact
prompt/cache split. Errors use Anthropic's envelope with `request_id`.
"""

from __future__ import annotations

import asyncio
import json
import time
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
from ninfer.server.body import parse_body
from ninfer.server.config import ServerConfig
from ninfer.server.errors import to_protocol_error
from ninfer.server.lifecycle import Observability, RequestShape

ANTHROPIC_PATHS = ("/v1/messages", "/v1/messages/count_tokens")
# Engine error code -> Anthropic HTTP status (spec: overload is 529, queue/media timeouts 504).
STATUS_BY_CODE = {"server_overloaded": 529, "request_queue_timeout": 504}


def is_anthropic_path(path: str) -> bool:
    """Paths of Anthropic's API family, built or not: their errors take Anthropic's shape."""
    return path in ANTHROPIC_PATHS or path.startswith("/v1/messages/") or path == "/v1/complete"


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
    def __init__(self, engine: Engine, config: ServerConfig, hub: Observability) -> None:
        self.engine = engine
        self.config = config
        self.hub = hub

    async def _parse(self, request: Request, *, count_only: bool) -> tuple[MessagesRequest, dict]:
        parsed = await parse_body(
            request,
            lambda body: parse_messages_request(
                body, default_max_tokens=self.config.default_max_tokens, count_only=count_only
            ),
        )
        kwargs = parsed.render_kwargs(
            default_thinking=not self.config.no_thinking,
            default_preserve=self.config.preserve_thinking,
        )
        return parsed, kwargs

    async def count_tokens(self, request: Request) -> HTTPResponse:
        parsed, kwargs = await self._parse(request, count_only=True)
        count = await asyncio.to_thread(
            self.engine.count_prompt_tokens, parsed.messages, parsed.tools, **kwargs
        )
        return response.json({"input_tokens": count})

    async def messages(self, request: Request) -> HTTPResponse | None:
        parsed, kwargs = await self._parse(request, count_only=False)
        enable_thinking = kwargs.pop("enable_thinking")
        budget = parsed.budget_tokens
        if budget is None and enable_thinking:
            budget = self.engine.default_thinking_budget
        shape = RequestShape(
            protocol="anthropic_messages",
            stream=parsed.stream,
            max_tokens=parsed.max_tokens,
            enable_thinking=enable_thinking,
            thinking_budget=budget,
            reasoning_effort=parsed.effort,
            preserve_thinking=parsed.preserve_thinking,
            num_messages=len(parsed.messages),
            num_tools=len(parsed.tools or ()),
            num_stop=len(parsed.stop),
            sampling=parsed.sampling,
        )
        lifecycle = self.hub.begin(request.ctx.request_id, shape)
        run = _MessageRun(lifecycle.request_id, parsed)
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
        await lifecycle.run(request, events, _MessageWire(run))
        return None


class _MessageWire:
    """Anthropic SSE events (named frames) or one Message body."""

    def __init__(self, run: _MessageRun) -> None:
        self.run = run
        self.stream = run.parsed.stream

    def error(self, exc: BaseException) -> ProtocolError:
        return anthropic_error(exc)

    def open(self) -> list[bytes]:
        return []  # message_start waits for admission (the exact cache split)

    def feed(self, event: ChatEvent) -> list[bytes]:
        items = self.run.events(event)
        return [event_frame(item) for item in items] if self.stream else []

    def close(self) -> list[bytes]:
        return []

    def failed(self, error: ProtocolError) -> list[bytes]:
        return [event_frame(("error", error_body(error, self.run.request_id)))]

    def body(self) -> dict[str, Any]:
        self.run.blocks.close()
        return self.run.body()


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
        self.num_creation = 0
        self.num_output = 0
        self.t_start = time.monotonic()

    def events(self, event: ChatEvent) -> list[Event]:
        out: list[Event] = []
        if event.kind in ("admitted", "progress"):
            self.num_prompt = event.num_prompt
            if event.kind == "admitted":
                self.num_cached = event.num_cached
                self.num_creation = event.num_cache_creation
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
        # Anthropic's three input counts are disjoint and add up to the prompt (clients sum them
        # for the context in use); admission fixes all three, so message_start is already exact
        if usage is None:
            prompt, output = self.num_prompt, self.num_output
            cached, created = self.num_cached, self.num_creation
        else:
            prompt, output = usage.prompt_tokens, usage.completion_tokens
            cached, created = usage.cached_tokens, usage.cache_creation_tokens
        return MessageUsage(prompt - cached - created, output, cached, created)

    def body(self) -> dict[str, Any]:
        return self.renderer.message(
            self.blocks.blocks,
            stop_reason=self.stop_reason,
            stop_sequence=self.stop_sequence,
            usage=self.usage(),
        )
