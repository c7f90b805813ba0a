"""OpenAI-compatible routes: /health, /v1/models and /v1/chat/completions over one Engine.

Glue only: `protocol.openai_chat` parses and renders, `ninfer.api.Engine.achat` runs. A stream's
headers wait for the engine's first event, so admission failures (429, 503 queue timeout, 400
context) are still plain HTTP errors; after that, failures arrive as an error frame. Closing the
event iterator (client gone, handler cancelled) cancels the engine request.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
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
from ninfer.server.config import ServerConfig
from ninfer.server.errors import to_protocol_error

log = logging.getLogger("ninfer.server")


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def read_json(request: Request) -> Any:
    try:
        return request.json
    except Exception:  # sanic raises BadRequest; the message names no field
        raise ProtocolError("the request body is not valid JSON", param=None) from None


class OpenAIRoutes:
    def __init__(self, engine: Engine, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
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
        chat = parse_chat_request(read_json(request))
        if chat.model != self.model_id:
            raise self._unknown_model(chat.model)
        run = _ChatRun(request.ctx.request_id, chat, self.model_id)
        template = chat.template_options(
            default_thinking=not self.config.no_thinking,
            default_preserve=self.config.preserve_thinking,
        )
        max_tokens = chat.max_tokens
        if max_tokens is None:
            max_tokens = self.config.default_max_tokens
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
            **chat.sampling,
        )
        return await sse.serve_events(
            events,
            self.config.keepalive_s,
            stream=chat.stream,
            on_stream=lambda first, source: self._stream(request, run, first, source),
            on_aggregate=lambda first, source: self._aggregate(run, first, source),
            on_disconnect=lambda: run.log(499, code="client_disconnected"),
        )

    async def _aggregate(
        self, run: _ChatRun, first: ChatEvent | None, source: AsyncIterator[ChatEvent | None]
    ) -> HTTPResponse:
        event = first
        while event is not None:
            run.observe(event)
            if event.kind == "finished":
                break
            event = await sse.next_event(source)
        body = run.renderer.completion(
            content="".join(run.content),
            reasoning="".join(run.reasoning),
            tool_calls=run.tool_calls,
            finish=run.finish,
            usage=run.usage(),
            timings=run.final_timings(),
        )
        run.log(200)
        return response.json(
            body, ensure_ascii=False, headers=sse.prefix_headers(run.finished, first)
        )

    async def _stream(
        self,
        request: Request,
        run: _ChatRun,
        first: ChatEvent | None,
        source: AsyncIterator[ChatEvent | None],
    ) -> None:
        stream = await request.respond(
            content_type="text/event-stream",
            headers={"cache-control": "no-cache", **sse.prefix_headers(first)},
        )
        assert stream is not None
        await stream.send(sse.data_frame(run.renderer.role_chunk()))
        try:
            event: Any = first
            while event is not sse.END:
                if event is None:  # idle heartbeat
                    await stream.send(sse.KEEPALIVE)
                else:
                    for frame in run.frames(event):
                        await stream.send(sse.data_frame(frame))
                    if event.kind == "finished":
                        break
                event = await anext(source, sse.END)
        except Exception as exc:  # after headers: report in-band, then end the stream
            error = to_protocol_error(exc)
            run.log(error.status, code=error.code)
            await stream.send(sse.data_frame(error.body()))
            await stream.eof()
            return
        await stream.send(sse.DONE)
        await stream.eof()
        run.log(200)


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
        first, last = self.t_first, self.t_last
        return Timings(
            cache_n=self.num_cached,
            prompt_n=self.num_prompt - self.num_cached,
            prompt_ms=((first or self.t_start) - self.t_start) * 1000.0,
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

    def log(self, status: int, *, code: str | None = None) -> None:
        elapsed_ms = (time.monotonic() - self.t_start) * 1000.0
        kind = "stream" if self.chat.stream else "aggregate"
        if code is not None:
            log.warning(
                "request %s chat.completions %s status=%d code=%s elapsed=%.0fms",
                self.request_id, kind, status, code, elapsed_ms,
            )  # fmt: skip
            return
        u = self.usage()
        ttft = f"{(self.t_first - self.t_start) * 1000.0:.0f}ms" if self.t_first else "-"
        log.info(
            "request %s chat.completions %s status=%d finish=%s prompt=%d cached=%d "
            "completion=%d reasoning=%d tools=%d ttft=%s elapsed=%.0fms",
            self.request_id, kind, status, self.finish, u.prompt_tokens, u.cached_tokens,
            u.completion_tokens, u.reasoning_tokens, len(self.tool_calls), ttft, elapsed_ms,
        )  # fmt: skip
