"""OpenAI Responses routes: create (aggregate or SSE), input_tokens, retrieve, delete, input_items.

Glue only: `protocol.openai_responses*` parse, lower and render; `Engine.achat` runs; the
`ResponseStore` keeps terminal Responses. As for Chat Completions, a stream's headers wait for the
engine's first event, so admission failures stay plain HTTP errors; later failures end the stream
with `response.failed`. A Response is stored before its terminal event is sent, so a client that
saw `response.completed` can retrieve or continue it at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sanic import Request, response
from sanic.response import HTTPResponse

from ninfer.api import ChatEvent, Engine
from ninfer.protocol.errors import ProtocolError, invalid, unsupported
from ninfer.protocol.openai_responses import (
    ResponsesRequest,
    engine_tool_name,
    parse_input_tokens_request,
    parse_responses_request,
)
from ninfer.protocol.openai_responses_items import has_user_message, lower_items
from ninfer.protocol.openai_responses_render import (
    EventSequencer,
    OutputBuilder,
    ResponseStatus,
    ResponseUsage,
    new_response_id,
    response_object,
    status_for,
)
from ninfer.server import sse
from ninfer.server.config import ServerConfig
from ninfer.server.errors import to_protocol_error
from ninfer.server.openai_routes import read_json
from ninfer.server.response_store import ResponseStore, StoredResponse, record_size

log = logging.getLogger("ninfer.server")
MAX_LIST_LIMIT = 100
DEFAULT_LIST_LIMIT = 20


def event_frame(event: dict[str, Any]) -> bytes:
    """A named SSE frame: the event name equals the JSON `type`."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


class ResponsesRoutes:
    def __init__(self, engine: Engine, config: ServerConfig) -> None:
        self.engine = engine
        self.config = config
        self.model_id = config.model_id or engine.model_id
        self.store = ResponseStore(
            config.response_store_max_records, config.response_store_max_mib << 20
        )

    # -- shared prompt path --------------------------------------------------------------------
    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_id:
            raise ProtocolError(
                f"the model {model!r} does not exist; this server serves {self.model_id!r}",
                status=404,
                code="model_not_found",
                param="model",
            )

    def _prepare(self, req: ResponsesRequest) -> _Prepared:
        """Parent lookup, history reconstruction and lowering: identical for Create and count."""
        parent: StoredResponse | None = None
        if req.previous_response_id is not None:
            parent = self.store.get(req.previous_response_id, param="previous_response_id")
        history = parent.history if parent is not None else []
        if not req.input_items and not has_user_message(history):
            raise invalid(
                "input", "is required unless previous_response_id supplies a user query",
                code="missing_required_parameter",
            )  # fmt: skip
        preserve = req.preserve_thinking
        if preserve is None:
            preserve = parent.preserve_thinking if parent else self.config.preserve_thinking
        template = req.template_options(
            default_thinking=not self.config.no_thinking, preserve=preserve
        )
        conversation = history + req.input_items
        marks: list[tuple[int, int]] = []
        messages = lower_items(conversation, engine_tool_name, num_history=len(history),
                               marks=marks)  # fmt: skip
        if req.instructions is not None:  # this request only: never saved into the history
            messages.insert(0, {"role": "developer", "content": req.instructions})
            marks = [(i + 1, offset) for i, offset in marks]
        return _Prepared(history, conversation, messages, template.enable_thinking,
                         template.kwargs, preserve, tuple(marks))  # fmt: skip

    # -- create --------------------------------------------------------------------------------
    async def create(self, request: Request) -> HTTPResponse | None:
        req = parse_responses_request(read_json(request))
        self._check_model(req.model)
        prep = self._prepare(req)
        if req.store:  # fail before generation when even the input cannot be kept
            self.store.check_fits(record_size({}, req.input_items, prep.conversation))
        run = _ResponseRun(request.ctx.request_id, req, self.model_id, prep)
        max_tokens = req.max_output_tokens
        if max_tokens is None:
            max_tokens = self.config.default_max_tokens
        events = self.engine.achat(
            prep.messages,
            req.tools.template_tools,
            enable_thinking=prep.enable_thinking,
            template_kwargs=prep.template_kwargs,
            max_tokens=max_tokens,
            request_id=run.request_id,
            cache_marks=prep.cache_marks,
            cache_implicit=req.cache_implicit,
            **req.sampling,
        )
        return await sse.serve_events(
            events,
            self.config.keepalive_s,
            stream=req.stream,
            on_stream=lambda first, source: self._stream(request, run, first, source),
            on_aggregate=lambda first, source: self._aggregate(run, first, source),
            on_disconnect=lambda: run.log(499, code="client_disconnected"),
        )

    async def _aggregate(
        self, run: _ResponseRun, first: ChatEvent | None, source: AsyncIterator[ChatEvent | None]
    ) -> HTTPResponse:
        event = first
        while event is not None:
            run.apply(event)
            if event.kind == "finished":
                break
            event = await sse.next_event(source)
        body = run.terminal()
        if run.req.store:
            self._keep(run, body)
        run.log(200)
        return response.json(
            body, ensure_ascii=False, headers=sse.prefix_headers(run.finished, first)
        )

    async def _stream(
        self,
        request: Request,
        run: _ResponseRun,
        first: ChatEvent | None,
        source: AsyncIterator[ChatEvent | None],
    ) -> None:
        stream = await request.respond(
            content_type="text/event-stream",
            headers={"cache-control": "no-cache", **sse.prefix_headers(first)},
        )
        assert stream is not None
        seq = EventSequencer()

        async def send(events: list[dict[str, Any]]) -> None:
            for event in seq.number(events):
                await stream.send(event_frame(event))

        start = run.snapshot(ResponseStatus.IN_PROGRESS)
        await send([
            {"type": "response.created", "response": start},
            {"type": "response.in_progress", "response": start},
        ])  # fmt: skip
        try:
            event: Any = sse.END if first is None else first
            while event is not sse.END:
                if event is None:  # idle heartbeat
                    await stream.send(sse.KEEPALIVE)
                else:
                    await send(run.apply(event))
                    if event.kind == "finished":
                        break
                event = await anext(source, sse.END)
            body = run.terminal()
            if run.req.store:
                self._keep(run, body)
            await send([{"type": f"response.{body['status']}", "response": body}])
        except Exception as exc:  # after headers: report in-band as response.failed
            error = to_protocol_error(exc)
            run.log(error.status, code=error.code)
            run.builder.finish(ResponseStatus.FAILED)  # the cut Item keeps its text, incomplete
            failed = run.snapshot(ResponseStatus.FAILED, error=error)
            await send([{"type": "response.failed", "response": failed}])
            await stream.eof()
            return
        await stream.eof()
        run.log(200)

    def _keep(self, run: _ResponseRun, body: dict[str, Any]) -> None:
        history = run.prep.conversation + [dict(item) for item in run.builder.output]
        self.store.put(body, run.req.input_items, history, preserve_thinking=run.prep.preserve)

    # -- input tokens --------------------------------------------------------------------------
    async def input_tokens(self, request: Request) -> HTTPResponse:
        req = parse_input_tokens_request(read_json(request))
        self._check_model(req.model)
        prep = self._prepare(req)
        kwargs = dict(prep.template_kwargs)
        kwargs["enable_thinking"] = prep.enable_thinking
        ids = await asyncio.to_thread(
            self.engine.render, prep.messages, req.tools.template_tools, **kwargs
        )
        return response.json({"object": "response.input_tokens", "input_tokens": len(ids)})

    # -- stored resources ----------------------------------------------------------------------
    async def retrieve(self, request: Request, response_id: str) -> HTTPResponse:
        if request.args.get("stream") not in (None, "false"):
            raise unsupported("stream", "stream recovery of a stored Response is not supported")
        if request.args.get("starting_after") is not None:
            raise unsupported("starting_after", "stream recovery is not supported")
        _reject_include(request)
        return response.json(self.store.get(response_id).response, ensure_ascii=False)

    async def delete(self, request: Request, response_id: str) -> HTTPResponse:
        self.store.get(response_id)  # 404 response_not_found when absent
        self.store.delete(response_id)
        return response.json({"id": response_id, "object": "response.deleted", "deleted": True})

    async def input_items(self, request: Request, response_id: str) -> HTTPResponse:
        _reject_include(request)
        limit_text = request.args.get("limit", str(DEFAULT_LIST_LIMIT))
        try:
            limit = int(limit_text)
        except ValueError:
            limit = 0
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise invalid("limit", f"must be an integer in 1..{MAX_LIST_LIMIT}, got {limit_text!r}")
        order = request.args.get("order", "desc")
        if order not in ("asc", "desc"):
            raise invalid("order", f"must be 'asc' or 'desc', got {order!r}")
        items = list(self.store.get(response_id).input_items)
        if order == "desc":
            items.reverse()
        after = request.args.get("after")
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise invalid("after", f"no input Item with id {after!r} in this Response")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return response.json(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > limit,
            },
            ensure_ascii=False,
        )

    async def cancel(self, request: Request, response_id: str) -> HTTPResponse:
        raise ProtocolError(
            "only background Responses can be cancelled, and background execution is not supported",
            code="background_not_supported",
            param="response_id",
        )

    async def compact(self, request: Request) -> HTTPResponse:
        raise ProtocolError(
            "Response compaction is not supported", code="compaction_not_supported", param=None
        )


def _reject_include(request: Request) -> None:
    for key, values in request.args.items():
        if key in ("include", "include[]") and any(values):
            raise unsupported("include", "no optional output data (include) can be added")


@dataclass
class _Prepared:
    history: list[dict[str, Any]]  # the parent's stored conversation
    conversation: list[dict[str, Any]]  # history + this request's input Items
    messages: list[dict[str, Any]]  # template messages (with this request's instructions)
    enable_thinking: bool
    template_kwargs: dict[str, Any]
    preserve: bool
    cache_marks: tuple[tuple[int, int], ...] = ()  # explicit prompt-cache breakpoints


@dataclass
class _ResponseRun:
    """One Response's output builder, usage and terminal object."""

    request_id: str
    req: ResponsesRequest
    model_id: str
    prep: _Prepared
    response_id: str = field(default_factory=new_response_id)
    created_at: int = field(default_factory=lambda: int(time.time()))
    builder: OutputBuilder = field(init=False)
    finished: ChatEvent | None = None
    num_prompt: int = 0
    num_cached: int = 0
    num_output: int = 0
    t_start: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.builder = OutputBuilder(self.req.tools.identity)

    def apply(self, event: ChatEvent) -> list[dict[str, Any]]:
        """Account one engine event; returns its stream events (unnumbered)."""
        if event.kind in ("admitted", "progress"):
            self.num_prompt = event.num_prompt
            if event.kind == "admitted":
                self.num_cached = event.num_cached
            return []
        if event.kind in ("reasoning", "content"):
            self.num_output = max(self.num_output, event.num_output)
            if event.kind == "reasoning":
                return self.builder.reasoning(event.text)
            return self.builder.content(event.text)
        if event.kind == "tool_call":
            assert event.tool_call is not None
            return self.builder.tool_call(event.tool_call.name, event.tool_call.arguments)
        if event.kind == "finished":
            self.finished = event
            return self.builder.finish(self.status)
        return []

    @property
    def status(self) -> ResponseStatus:
        reason = self.finished.finish_reason if self.finished is not None else None
        return status_for(reason.value if reason is not None else "stop")

    def usage(self) -> ResponseUsage:
        usage = self.finished.usage if self.finished is not None else None
        if usage is None:
            return ResponseUsage(self.num_prompt, self.num_output, self.num_cached)
        return ResponseUsage(
            usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens,
            usage.reasoning_tokens,
        )  # fmt: skip

    def snapshot(
        self, status: ResponseStatus, *, error: ProtocolError | None = None
    ) -> dict[str, Any]:
        failed = None if error is None else {"code": error.code, "message": error.message}
        return response_object(
            response_id=self.response_id,
            created_at=self.created_at,
            model=self.model_id,
            status=status,
            output=self.builder.output if status != ResponseStatus.IN_PROGRESS else [],
            request=self.req,
            usage=None if status == ResponseStatus.IN_PROGRESS else self.usage(),
            error=failed,
            reasoning_effort=self.req.reasoning_effort,
        )

    def terminal(self) -> dict[str, Any]:
        body = self.snapshot(self.status)
        if self.status == ResponseStatus.COMPLETED:
            body["completed_at"] = int(time.time())
        return body

    def log(self, status: int, *, code: str | None = None) -> None:
        elapsed_ms = (time.monotonic() - self.t_start) * 1000.0
        kind = "stream" if self.req.stream else "aggregate"
        if code is not None:
            log.warning(
                "request %s responses %s status=%d code=%s elapsed=%.0fms",
                self.request_id, kind, status, code, elapsed_ms,
            )  # fmt: skip
            return
        u = self.usage()
        log.info(
            "request %s responses %s status=%d response=%s state=%s input=%d cached=%d "
            "output=%d reasoning=%d items=%d elapsed=%.0fms",
            self.request_id, kind, status, self.response_id, self.status.value, u.input_tokens,
            u.cached_tokens, u.output_tokens, u.reasoning_tokens, len(self.builder.output),
            elapsed_ms,
        )  # fmt: skip
