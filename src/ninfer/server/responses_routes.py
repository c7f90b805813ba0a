"""OpenAI Responses routes: create (aggregate or SSE), input_tokens, retrieve, delete, input_items.

Glue only: `protocol.openai_responses*` parse, lower and render; `Engine.achat` runs; the shared
`Lifecycle` owns clocks, keep-alive, delivery and the terminal record; the `ResponseStore` keeps
terminal Responses. Preparation failures stay plain HTTP errors; a stream opens with
`response.created` / `response.in_progress` as soon as the engine accepts the request, and later
failures end it with `response.failed`. A Response is stored before its terminal event is sent,
so a client that saw `response.completed` can retrieve or continue it at once.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
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
from ninfer.protocol.reasoning_seal import ReasoningSeal, key_from_text
from ninfer.server.body import off_loop_if_large, parse_body
from ninfer.server.config import ServerConfig
from ninfer.server.errors import to_protocol_error
from ninfer.server.lifecycle import Observability, RequestShape
from ninfer.server.response_store import ResponseStore, StoredResponse, record_size

IGNORED_TOOLS_HEADER = "x-ninfer-ignored-tools"
REASONING_KEY_ENV = "NINFER_REASONING_KEY"
MAX_LIST_LIMIT = 100
DEFAULT_LIST_LIMIT = 20


def event_frame(event: dict[str, Any]) -> bytes:
    """A named SSE frame: the event name equals the JSON `type`."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


class ResponsesRoutes:
    def __init__(self, engine: Engine, config: ServerConfig, hub: Observability) -> None:
        self.engine = engine
        self.config = config
        self.hub = hub
        self.model_id = config.model_id or engine.model_id
        self.store = ResponseStore(
            config.response_store_max_records, config.response_store_max_mib << 20
        )
        key = config.reasoning_key
        if key is None and os.environ.get(REASONING_KEY_ENV):
            key = key_from_text(os.environ[REASONING_KEY_ENV])
        self.seal = ReasoningSeal(key, self.model_id)

    def _parse(self, body: Any) -> ResponsesRequest:
        return parse_responses_request(body, seal=self.seal)

    def _parse_count(self, body: Any) -> ResponsesRequest:
        return parse_input_tokens_request(body, seal=self.seal)

    # -- shared prompt path --------------------------------------------------------------------
    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_id:
            raise ProtocolError(
                f"the model {model!r} does not exist; this server serves {self.model_id!r}",
                status=404,
                code="model_not_found",
                param="model",
            )

    async def _prepare(self, request: Request, req: ResponsesRequest) -> _Prepared:
        """Parent lookup (on the loop: the store is not thread-safe), then history reconstruction
        and lowering (on a body worker when the body is large): identical for Create and count."""
        parent: StoredResponse | None = None
        if req.previous_response_id is not None:
            parent = self.store.get(req.previous_response_id, param="previous_response_id")
        return await off_loop_if_large(request, lambda: self._lower(req, parent))

    def _lower(self, req: ResponsesRequest, parent: StoredResponse | None) -> _Prepared:
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
        req = await parse_body(request, self._parse)
        self._check_model(req.model)
        prep = await self._prepare(request, req)
        if req.store:  # fail before generation when even the input cannot be kept
            size = await off_loop_if_large(
                request, lambda: record_size({}, req.input_items, prep.conversation)
            )
            self.store.check_fits(size)
        max_tokens = req.max_output_tokens
        if max_tokens is None:
            max_tokens = self.config.default_max_tokens
        shape = RequestShape(
            protocol="openai_responses",
            stream=req.stream,
            max_tokens=max_tokens,
            enable_thinking=prep.enable_thinking,
            thinking_budget=self.engine.default_thinking_budget if prep.enable_thinking else None,
            reasoning_effort=req.reasoning_effort,
            preserve_thinking=req.preserve_thinking,
            num_messages=len(prep.messages),
            num_tools=len(req.tools.template_tools or ()),
            sampling=req.sampling,
        )
        lifecycle = self.hub.begin(request.ctx.request_id, shape)
        sealer = self.seal.seal if req.include_encrypted_reasoning else None
        run = _ResponseRun(lifecycle.request_id, req, self.model_id, prep, sealer)
        events = self.engine.achat(
            prep.messages,
            req.tools.template_tools,
            enable_thinking=prep.enable_thinking,
            template_kwargs=prep.template_kwargs,
            max_tokens=max_tokens,
            request_id=run.request_id,
            single_tool_call=not req.parallel_tool_calls,
            cache_marks=prep.cache_marks,
            cache_implicit=req.cache_implicit,
            **req.sampling,
        )
        await lifecycle.run(request, events, _ResponseWire(run, self), _ignored_header(req))
        return None

    def _keep(self, run: _ResponseRun, body: dict[str, Any]) -> None:
        history = run.prep.conversation + [dict(item) for item in run.builder.output]
        self.store.put(body, run.req.input_items, history, preserve_thinking=run.prep.preserve)

    # -- input tokens --------------------------------------------------------------------------
    async def input_tokens(self, request: Request) -> HTTPResponse:
        req = await parse_body(request, self._parse_count)
        self._check_model(req.model)
        prep = await self._prepare(request, req)
        kwargs = dict(prep.template_kwargs)
        kwargs["enable_thinking"] = prep.enable_thinking
        count = await asyncio.to_thread(
            self.engine.count_prompt_tokens, prep.messages, req.tools.template_tools, **kwargs
        )
        return response.json({"object": "response.input_tokens", "input_tokens": count})

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
        await parse_body(request, lambda body: body)  # malformed text is reported as such first
        raise ProtocolError(
            "Response compaction is not supported", code="compaction_not_supported", param=None
        )


class _ResponseWire:
    """Responses semantic SSE events (numbered, named frames) or one Response body; stores the
    terminal Response before it is sent."""

    def __init__(self, run: _ResponseRun, routes: ResponsesRoutes) -> None:
        self.run = run
        self.routes = routes
        self.stream = run.req.stream
        self.seq = EventSequencer()

    def _frames(self, events: list[dict[str, Any]]) -> list[bytes]:
        return [event_frame(event) for event in self.seq.number(events)]

    def error(self, exc: BaseException) -> ProtocolError:
        return to_protocol_error(exc)

    def open(self) -> list[bytes]:
        start = self.run.snapshot(ResponseStatus.IN_PROGRESS)
        return self._frames([
            {"type": "response.created", "response": start},
            {"type": "response.in_progress", "response": start},
        ])  # fmt: skip

    def feed(self, event: ChatEvent) -> list[bytes]:
        events = self.run.apply(event)
        return self._frames(events) if self.stream else []

    def _terminal(self) -> dict[str, Any]:
        body = self.run.terminal()
        if self.run.req.store:
            self.routes._keep(self.run, body)  # may raise: the store cannot hold it
        return body

    def close(self) -> list[bytes]:
        body = self._terminal()
        return self._frames([{"type": f"response.{body['status']}", "response": body}])

    def failed(self, error: ProtocolError) -> list[bytes]:
        self.run.builder.finish(ResponseStatus.FAILED)  # the cut Item keeps its text, incomplete
        failed = self.run.snapshot(ResponseStatus.FAILED, error=error)
        return self._frames([{"type": "response.failed", "response": failed}])

    def body(self) -> dict[str, Any]:
        return self._terminal()


def _ignored_header(req: ResponsesRequest) -> dict[str, str]:
    """Hosted tools accepted but not offered to the model, so a client can tell."""
    return {IGNORED_TOOLS_HEADER: ", ".join(req.tools.ignored)} if req.tools.ignored else {}


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
    sealer: Callable[[str], str] | None = None  # set when reasoning.encrypted_content is included
    response_id: str = field(default_factory=new_response_id)
    created_at: int = field(default_factory=lambda: int(time.time()))
    builder: OutputBuilder = field(init=False)
    finished: ChatEvent | None = None
    num_prompt: int = 0
    num_cached: int = 0
    num_output: int = 0
    t_start: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        tools = self.req.tools
        self.builder = OutputBuilder(tools.identity, kind=tools.kind, seal=self.sealer)

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
