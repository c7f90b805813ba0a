"""OpenAI-compatible routes: /health, /v1/models and /v1/chat/completions over one Engine.

Glue only: `protocol.openai_chat` parses and renders, `ninfer.api.Engine.achat` runs, and the
shared `Lifecycle` (server/lifecycle.py) owns clocks, admission, keep-alive, delivery and the
terminal record. Preparation failures (429, 400 context) stay plain HTTP errors; once the engine
has accepted the request a stream's headers are out, so later failures (a queue timeout, an
engine failure) arrive as one `data: {"error": ...}` frame.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sanic import Request, response
from sanic.response import HTTPResponse

from ninfer.api import ChatEvent, Engine
from ninfer.engine.request import Timings
from ninfer.protocol.errors import INVALID_REQUEST, ProtocolError
from ninfer.protocol.openai_chat import ChatCompletionRequest, parse_chat_request
from ninfer.protocol.openai_chat_render import (
    ChatRenderer,
    CompletionUsage,
    finish_reason,
    tool_call_dict,
)
from ninfer.server import sse
from ninfer.server.body import parse_body
from ninfer.server.config import ServerConfig
from ninfer.server.errors import to_protocol_error
from ninfer.server.lifecycle import Observability, RequestShape


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class OpenAIRoutes:
    def __init__(self, engine: Engine, config: ServerConfig, hub: Observability) -> None:
        self.engine = engine
        self.config = config
        self.hub = hub
        self.model_id = config.model_id or engine.model_id
        self.created = int(time.time())

    # -- small endpoints -------------------------------------------------------------------------
    async def health(self, request: Request) -> HTTPResponse:
        if self.engine.core.healthy:
            return response.json({"status": "ok"})
        return response.json({"status": "unavailable"}, status=503)

    def _model(self) -> dict[str, Any]:
        return {
            "id": self.model_id,
            "object": "model",
            "created": self.created,
            "owned_by": "ninfer",
            "max_model_len": self.engine.options.max_context,
        }

    async def list_models(self, request: Request) -> HTTPResponse:
        return response.json({"object": "list", "data": [self._model()]})

    async def get_model(self, request: Request, model_id: str) -> HTTPResponse:
        if model_id != self.model_id:
            raise self._unknown_model(model_id)
        return response.json(self._model())

    def _unknown_model(self, model_id: str) -> ProtocolError:
        return ProtocolError(
            f"the model {model_id!r} does not exist; this server serves {self.model_id!r}",
            status=404,
            code="model_not_found",
            param="model",
            type=INVALID_REQUEST,
        )

    # -- chat completions ------------------------------------------------------------------------
    async def chat_completions(self, request: Request) -> HTTPResponse | None:
        chat = await parse_body(request, parse_chat_request)
        if chat.model != self.model_id:
            raise self._unknown_model(chat.model)
        template = chat.template_options(
            default_thinking=not self.config.no_thinking,
            default_preserve=self.config.preserve_thinking,
        )
        max_tokens = chat.max_tokens
        if max_tokens is None:
            max_tokens = self.config.default_max_tokens
        shape = RequestShape(
            protocol="openai_chat",
            stream=chat.stream,
            max_tokens=max_tokens,
            enable_thinking=template.enable_thinking,
            thinking_budget=self.engine.default_thinking_budget
            if template.enable_thinking
            else None,
            reasoning_effort=chat.reasoning_effort,
            preserve_thinking=chat.preserve_thinking,
            num_messages=len(chat.messages),
            num_tools=len(chat.tools or ()),
            num_stop=len(chat.stop),
            sampling=chat.sampling,
        )
        lifecycle = self.hub.begin(request.ctx.request_id, shape)
        run = _ChatRun(lifecycle.request_id, chat, self.model_id)
        events = self.engine.achat(
            chat.messages,
            chat.tools,
            enable_thinking=template.enable_thinking,
            template_kwargs=template.kwargs,
            max_tokens=max_tokens,
            stop=chat.stop,
            request_id=run.request_id,
            cache_marks=chat.cache_marks,
            cache_implicit=chat.cache_implicit,
            ignore_eos=chat.ignore_eos,
            **chat.sampling,
        )
        await lifecycle.run(request, events, _ChatWire(run))
        return None


class _ChatWire:
    """Chat Completions chunks (SSE `data:` frames ending in [DONE]) or one completion body."""

    def __init__(self, run: _ChatRun) -> None:
        self.run = run
        self.stream = run.chat.stream

    def error(self, exc: BaseException) -> ProtocolError:
        return to_protocol_error(exc)

    def open(self) -> list[bytes]:
        return [sse.data_frame(self.run.renderer.role_chunk())]

    def feed(self, event: ChatEvent) -> list[bytes]:
        if not self.stream:
            self.run.observe(event)
            return []
        return [sse.data_frame(frame) for frame in self.run.frames(event)]

    def close(self) -> list[bytes]:
        return [sse.DONE]

    def failed(self, error: ProtocolError) -> list[bytes]:
        return [sse.data_frame(error.body())]

    def body(self) -> dict[str, Any]:
        run = self.run
        return run.renderer.completion(
            content="".join(run.content),
            reasoning="".join(run.reasoning),
            tool_calls=run.tool_calls,
            finish=run.finish,
            usage=run.usage(),
            timings=run.final_timings(),
        )


@dataclass
class _ChatRun:
    """One completion's accumulated output, clocks and chunk rendering."""

    request_id: str
    chat: ChatCompletionRequest
    model_id: str
    renderer: ChatRenderer = field(init=False)
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finished: ChatEvent | None = None
    num_prompt: int = 0
    num_cached: int = 0
    num_output: int = 0
    progress_started: bool = False
    t_start: float = field(default_factory=time.monotonic)
    t_first: float | None = None
    t_last: float | None = None
    t_admitted: float | None = None
    timings: Timings | None = None  # the latest engine snapshot carried by a text event

    def __post_init__(self) -> None:
        self.renderer = ChatRenderer(
            "chatcmpl-" + self.request_id.removeprefix("req-"),
            self.model_id,
            int(time.time()),
            include_usage=self.chat.include_usage,
        )

    @property
    def finish(self) -> str:
        reason = self.finished.finish_reason if self.finished else None
        return finish_reason(reason.value if reason else "stop", bool(self.tool_calls))

    def observe(self, event: ChatEvent) -> dict[str, Any] | None:
        """Account one event; returns the tool call's dict for tool_call events."""
        now = time.monotonic()
        if event.kind in ("admitted", "progress"):
            self.num_prompt = event.num_prompt
            if event.kind == "admitted":
                self.t_admitted = now
                self.num_cached = event.num_cached
        elif event.kind in ("reasoning", "content"):
            # num_output is the committed frontier, including commits whose text is still held
            if event.num_output > self.num_output:
                self.num_output = event.num_output
                self.t_first = self.t_first or now
                self.t_last = now
            self.timings = event.timings or self.timings
            (self.reasoning if event.kind == "reasoning" else self.content).append(event.text)
        elif event.kind == "tool_call":
            assert event.tool_call is not None
            call = tool_call_dict(event.tool_call, new_call_id())
            self.tool_calls.append(call)
            return call
        elif event.kind == "finished":
            self.finished = event
        return None

    def frames(self, event: ChatEvent) -> list[dict[str, Any]]:
        """The stream chunks for one event."""
        call = self.observe(event)
        r = self.renderer
        if event.kind in ("admitted", "progress"):
            if not self.chat.return_progress:
                return []
            out = []
            if not self.progress_started:  # the initial event: processed == cache
                self.progress_started = True
                out.append(r.progress_chunk(self._progress(self.num_cached)))
            if event.kind == "progress":
                out.append(r.progress_chunk(self._progress(event.num_processed)))
            return out
        if event.kind in ("reasoning", "content"):
            timings = self._snapshot() if self.chat.timings_per_token else None
            return [r.text_chunk(event.kind, event.text, timings)]
        if call is not None:
            assert event.tool_call is not None
            return [r.tool_call_chunk(event.tool_call, call["id"])]
        if event.kind == "finished":
            if self.chat.include_usage:
                return [
                    r.finish_chunk(self.finish),
                    r.usage_chunk(self.usage(), self.final_timings()),
                ]
            return [r.finish_chunk(self.finish, self.final_timings())]
        return []

    def _progress(self, processed: int) -> dict[str, Any]:
        # spec: time_ms is elapsed wall time since committed admission
        elapsed_ms = int((time.monotonic() - (self.t_admitted or self.t_start)) * 1000)
        return {
            "total": self.num_prompt,
            "cache": self.num_cached,
            "processed": processed,
            "time_ms": elapsed_ms,
        }

    def _snapshot(self) -> dict[str, Any]:
        if self.timings is not None:  # the engine's, on the same clock as the terminal timings
            return self.timings.to_dict()
        # events without engine timings (a caller's own event source): this stream's clock
        start = self.t_admitted or self.t_start
        first, last = self.t_first, self.t_last
        return Timings(
            cache_n=self.num_cached,
            prompt_n=self.num_prompt - self.num_cached,
            prompt_ms=((first or start) - start) * 1000.0,
            predicted_n=self.num_output,
            predicted_ms=((last or 0.0) - (first or 0.0)) * 1000.0,
        ).to_dict()

    def usage(self) -> CompletionUsage:
        usage = self.finished.usage if self.finished else None
        if usage is None:
            return CompletionUsage(self.num_prompt, self.num_output, self.num_cached)
        return CompletionUsage(
            usage.prompt_tokens,
            usage.completion_tokens,
            usage.cached_tokens,
            usage.reasoning_tokens,
        )

    def final_timings(self) -> dict[str, Any]:
        if self.finished is not None and self.finished.timings is not None:
            return self.finished.timings.to_dict()
        return self._snapshot()
