"""One generation request's life, shared by Chat Completions, Responses and Messages: id, clocks,
engine events (read by its own task, so the outcome is known after the client left), keep-alive,
delivery, and exactly one terminal (JSONL record, stderr line, metrics). Routes only supply a
`Wire` for their format. No sanic import: the request object is duck-typed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ninfer.api import ChatEvent
from ninfer.engine.request import FinishReason, RequestStats
from ninfer.protocol.errors import ProtocolError
from ninfer.server import request_records as records
from ninfer.server import sse
from ninfer.server.config import ServerConfig
from ninfer.server.delivery import unsent_bytes
from ninfer.server.errors import to_protocol_error
from ninfer.server.logs import level_for_status, seconds
from ninfer.server.metrics import ServerMetrics
from ninfer.server.request_log import RequestLog

log = logging.getLogger("ninfer.server")
API_NAMES = {
    "openai_chat": "chat.completions",
    "openai_responses": "responses",
    "anthropic_messages": "messages",
}
CLIENT_CLOSED = 499  # nginx's "client closed request": the response never fully left


def server_stopping() -> ProtocolError:
    """What a request still in flight at shutdown is told (in band once its stream is open)."""
    return ProtocolError(
        "the server is shutting down; the request was ended before it completed",
        status=503,
        code="server_stopping",
        type="server_error",
    )


HEADER_GRACE_S = 0.25  # how long a stream's headers wait for its admission (prefix header)
IDLE: Any = object()  # no event within the keep-alive interval
END: Any = object()  # the engine's event stream is over


class Wire(Protocol):
    """One API family's translation of engine events (ChatEvents) into bytes or a body.

    `feed` sees every event after "submitted" (which the lifecycle keeps for itself)."""

    stream: bool

    def error(self, exc: BaseException) -> ProtocolError:
        """The family's error for a failure (Anthropic maps overload to 529, for example)."""

    def open(self) -> list[bytes]:
        """Frames right after the stream's headers (may be empty)."""

    def feed(self, event: ChatEvent) -> list[bytes]:
        """Account one event; in stream mode also its frames (aggregate wires return [])."""

    def close(self) -> list[bytes]:
        """Frames after the finished event's; may raise ProtocolError (e.g. a full store)."""

    def failed(self, error: ProtocolError) -> list[bytes]:
        """In-band frames reporting an error after the headers."""

    def body(self) -> dict[str, Any]:
        """The aggregate response body; may raise ProtocolError."""


@dataclass(frozen=True)
class RequestShape:
    """What the log records about a request: options and counts, never text."""

    protocol: str  # a key of API_NAMES
    stream: bool
    max_tokens: int
    enable_thinking: bool
    thinking_budget: int | None = None
    reasoning_effort: str | None = None
    preserve_thinking: bool | None = None
    num_messages: int = 0
    num_tools: int = 0
    num_stop: int = 0
    sampling: Mapping[str, Any] = field(default_factory=dict)  # the request's own fields

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": self.protocol,
            "stream": self.stream,
            "max_tokens": self.max_tokens,
            "enable_thinking": self.enable_thinking,
            "thinking_budget": self.thinking_budget,
            "requested_reasoning_effort": self.reasoning_effort,
            "preserve_thinking": self.preserve_thinking,
            "num_messages": self.num_messages,
            "num_tools": self.num_tools,
            "num_stop": self.num_stop,
            "sampling_requested": {k: v for k, v in self.sampling.items() if v is not None},
        }


class _Stalled(Exception):
    """A write could not reach the kernel within the delivery timeout: the client stopped
    reading."""


@dataclass
class _Failure:
    exc: BaseException


class _ClientGone(Exception):
    """The client left while the request was still being prepared."""


class Observability:
    """The server-wide side of every lifecycle: config, JSONL log, metrics, shutdown drain."""

    def __init__(
        self, engine: Any, config: ServerConfig, request_log: RequestLog, metrics: ServerMetrics
    ) -> None:
        self.engine = engine
        self.config = config
        self.request_log = request_log
        self.metrics = metrics
        self.active: set[Lifecycle] = set()
        self.shutting_down = False
        self.settled_in_drain: dict[str, int] = {}

    def begin(self, request_id: str, shape: RequestShape) -> Lifecycle:
        return Lifecycle(self, request_id, shape)

    def cancel_engine(self, request_id: str) -> None:
        self.engine.core.cancel(request_id)

    def start_drain(self, grace_s: float) -> None:
        """Server stop requested: what is in flight may finish for `grace_s`; what is left then
        is ended with a clean ending (a 503 `server_stopping`, in band once streaming) before
        the HTTP server's own grace runs out and cuts its connection mid-body."""
        self.shutting_down = True
        states: dict[str, int] = {}
        for lc in self.active:
            states[lc.state] = states.get(lc.state, 0) + 1
        detail = " ".join(f"{k}={v}" for k, v in sorted(states.items())) or "none"
        log.info(
            "shutdown: draining %d requests in flight (%s); those left in %.0f s are ended",
            len(self.active), detail, grace_s,
        )  # fmt: skip
        if self.active:
            asyncio.get_running_loop().call_later(max(0.0, grace_s), self.end_in_flight)

    def end_in_flight(self) -> None:
        """The drain's grace is over: end every request still in flight."""
        if self.active:
            log.info("shutdown: ending %d requests still in flight", len(self.active))
        for lc in list(self.active):
            lc.stop_for_shutdown()

    async def finish_drain(self, timeout_s: float = 10.0) -> None:
        """Cancel what is left, wait for the engine's outcomes, and log the drain's counts."""
        left = list(self.active)
        for lc in left:
            lc.abandon("cancelled")
        readers = [lc.reader for lc in left if lc.reader is not None and not lc.reader.done()]
        if readers:
            await asyncio.wait(readers, timeout=timeout_s)
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.settled_in_drain.items()))
        log.info(
            "shutdown drain: %d settled during drain (%s), %d cancelled at stop, %d unsettled",
            sum(self.settled_in_drain.values()), counts or "none", len(left), len(self.active),
        )  # fmt: skip

    def settled(self, lc: Lifecycle, outcome: str) -> None:
        self.active.discard(lc)
        if self.shutting_down:
            self.settled_in_drain[outcome] = self.settled_in_drain.get(outcome, 0) + 1


class Lifecycle:
    def __init__(self, hub: Observability, request_id: str, shape: RequestShape) -> None:
        self.hub = hub
        self.request_id = request_id
        self.shape = shape
        self.t_start = time.monotonic()
        self.state = "preparing"  # preparing | waiting | prefilling | decoding | done
        self.reader: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        # engine side (written by the reader task)
        self.engine_request_id: str | None = None
        self.num_prompt = 0
        self.t_submitted: float | None = None
        self.t_engine_end: float | None = None
        self.admitted: RequestStats | None = None
        self.finished: ChatEvent | None = None
        self.failure: BaseException | None = None
        self.num_tool_calls = 0
        self._engine_done = False
        # response side (written by the handler)
        self.wire: Wire | None = None
        self._request: Any = None
        self._stream: Any = None  # the Sanic response once headers are sent
        self.error: ProtocolError | None = None  # the error the client was given
        self.response_failure: ProtocolError | None = None
        self.delivery: str | None = None  # delivered | client_gone | cancelled
        self._last_write = self.t_start
        self._settled = False
        self._headers: dict[str, str] = {}

    # -- the handler's side ----------------------------------------------------------------------
    async def run(
        self,
        request: Any,
        events: AsyncIterator[ChatEvent],
        wire: Wire,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Serve one generation response; returns None (the response is written here) or raises
        the HTTP error for a failure before any byte was sent. `headers` go on the response
        (stream or body), e.g. x-ninfer-ignored-tools."""
        self.wire, self._request = wire, request
        self._headers = dict(headers or {})
        self.hub.active.add(self)
        self.reader = asyncio.get_running_loop().create_task(self._read(events))
        try:
            await self._respond()
        except asyncio.CancelledError:
            self.abandon("cancelled" if self.hub.shutting_down else "client_gone")
            raise
        except _Stalled:
            self.abandon("client_gone")
            transport = getattr(request, "transport", None)
            if transport is not None:
                transport.abort()  # the connection cannot carry a clean ending any more
            raise asyncio.CancelledError from None
        except ProtocolError as error:
            if self.delivery is None:  # raised by a wire, not yet accounted
                self._account_failure(error)
                self._request.ctx.outcome_logged = True
                self.delivery = "delivered"
                self._maybe_settle()
            raise  # the app's handler writes the error body
        except Exception as exc:  # a bug in rendering: answer 500, never lose the terminal
            await self._fail(exc, internal=True)

    def stop_for_shutdown(self) -> None:
        """Cancel the engine work; the response then ends with `server_stopping`."""
        self._cancel_work()

    def abandon(self, delivery: str) -> None:
        """The response will not complete: cancel the engine request; the reader settles."""
        if self.delivery is None:
            self.delivery = delivery
        self._cancel_work()
        self._maybe_settle()

    def _cancel_work(self) -> None:
        if self._engine_done:
            return
        if self.engine_request_id is not None:
            self.hub.cancel_engine(self.engine_request_id)
        elif self.reader is not None:
            self.reader.cancel()  # still preparing: nothing reached the engine yet

    async def _respond(self) -> None:
        wire = self._wire
        item = await self._next()
        while item is IDLE:  # preparation is slow: a stream commits to SSE and keeps alive
            await self._keepalive()
            item = await self._next()
        if isinstance(item, _Failure):
            return await self._fail(item.exc)
        if item is END or item.kind != "submitted":
            raise RuntimeError("the engine stream did not start with 'submitted'")
        pending: Any = None
        if wire.stream and self._stream is None:
            # Headers go out at once; an admission arriving within a short grace (a free lane)
            # first lends them its x-ninfer-prefix-cache value.
            try:
                pending = await asyncio.wait_for(self._queue.get(), HEADER_GRACE_S)
            except TimeoutError:
                pending = None
            self._note_prefix(pending)
            await self._open()
        while True:
            item, pending = (pending, None) if pending is not None else (await self._next(), None)
            if item is IDLE:
                await self._keepalive()
                continue
            if isinstance(item, _Failure):
                return await self._fail(item.exc)
            if item is END:
                raise RuntimeError("the engine stream ended without an outcome")
            if item.kind == "finished" and self._stopped_by_shutdown(item):
                self.response_failure = server_stopping()
                return await self._fail(self.response_failure)
            self._note_prefix(item)
            frames = wire.feed(item)
            if self._stream is not None and frames:
                await self._send(frames)
            if item.kind == "finished":
                break
        await self._finish()

    def _stopped_by_shutdown(self, item: ChatEvent) -> bool:
        return self.hub.shutting_down and item.finish_reason == FinishReason.CANCELLED

    def _note_prefix(self, item: Any) -> None:
        """Keep the first x-ninfer-prefix-cache value an engine event carries (for headers not
        yet sent: every aggregate body, and streams admitted within the grace)."""
        value = getattr(item, "prefix_cache", None)
        if value and sse.PREFIX_CACHE_HEADER not in self._headers:
            self._headers[sse.PREFIX_CACHE_HEADER] = value

    @property
    def _wire(self) -> Wire:
        assert self.wire is not None
        return self.wire

    async def _next(self) -> Any:
        """The next queued item; IDLE when a stream went keep-alive interval without a write."""
        if not self._queue.empty():
            return self._queue.get_nowait()
        if not self._wire.stream:
            return await self._queue.get()
        remaining = self._last_write + self.hub.config.keepalive_s - time.monotonic()
        if remaining <= 0:
            return IDLE
        try:
            return await asyncio.wait_for(self._queue.get(), remaining)
        except TimeoutError:
            return IDLE

    async def _open(self) -> bool:
        """Send the stream's headers and opening frames; True when frames were written."""
        self._stream = await self._request.respond(
            content_type="text/event-stream", headers={"cache-control": "no-cache", **self._headers}
        )
        frames = self._wire.open()
        await self._send(frames or [b""])  # an empty write still puts the headers out
        return bool(frames)

    async def _keepalive(self) -> None:
        if self._stream is None and await self._open():
            return  # the opening frames were this interval's write
        await self._send([sse.KEEPALIVE])

    async def _send(self, frames: list[bytes], *, end: bool = False) -> None:
        data = b"".join(frames)
        transport = getattr(self._request, "transport", None)
        if transport is None or not transport.get_write_buffer_size():
            await self._stream.send(data, end_stream=end)  # cannot block on backpressure
        else:
            try:
                await asyncio.wait_for(
                    self._stream.send(data, end_stream=end), self.hub.config.delivery_timeout_s
                )
            except TimeoutError:
                raise _Stalled from None
        self._last_write = time.monotonic()

    async def _confirm_delivery(self) -> None:
        """Delivered: within the delivery timeout every byte left our buffer and the kernel
        put it on the wire. A client that stopped reading closes its TCP window, so the tail
        stays unsent in the socket even when it fits in the kernel's buffers. There is no event
        for that: poll (one ioctl) with backoff, which a reading client never needs."""
        transport = getattr(self._request, "transport", None)
        deadline = time.monotonic() + self.hub.config.delivery_timeout_s
        delay = 0.001
        while transport is not None and unsent_bytes(transport):
            if transport.is_closing() or time.monotonic() > deadline:
                raise _Stalled
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        self.delivery = "delivered"
        self._maybe_settle()

    async def _finish(self) -> None:
        wire = self._wire
        if self._stream is not None:
            try:
                frames = wire.close()
            except ProtocolError as error:  # e.g. the Response outgrew the store
                self.response_failure = error
                frames = wire.failed(error)
            await self._send(frames)
            await self._stream.eof()
        else:
            try:
                body = wire.body()
            except ProtocolError as error:
                self.response_failure = error
                return await self._reject_http(error)
            data = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
            extra = {"headers": self._headers} if self._headers else {}
            self._stream = await self._request.respond(content_type="application/json", **extra)
            await self._send([data], end=True)
        await self._confirm_delivery()

    async def _fail(self, exc: BaseException, *, internal: bool = False) -> None:
        """A failure before the outcome (or a render bug): HTTP error if nothing was sent yet,
        else in-band error frames and the end of the stream."""
        error = to_protocol_error(exc) if internal else self._wire.error(exc)
        if internal:
            log.debug("request %s: response failed", self.request_id, exc_info=exc)
            self._account_failure(error)
        else:
            self.error = error
        if self._stream is None:
            return await self._reject_http(error)
        await self._send(self._wire.failed(error))
        await self._stream.eof()
        await self._confirm_delivery()

    def _account_failure(self, error: ProtocolError) -> None:
        """A response failure of ours: record it and stop the engine work nobody will see."""
        self.response_failure = error
        if not self._engine_done and self.engine_request_id is not None:
            self.hub.cancel_engine(self.engine_request_id)

    async def _reject_http(self, error: ProtocolError) -> None:
        # The app's error handler writes the body; this lifecycle already logged the request.
        self._request.ctx.outcome_logged = True
        self.delivery = "delivered"
        self._maybe_settle()
        raise error

    # -- the engine's side (reader task) -------------------------------------------------------
    async def _read(self, events: AsyncIterator[ChatEvent]) -> None:
        try:
            async for event in events:
                if event.kind == "scheduling":  # a log record only: no wire sees it
                    self._log_scheduling(event)
                    continue
                self._observe(event)
                self._queue.put_nowait(event)
        except asyncio.CancelledError:  # the client left, or the server stops, in preparation
            if self.hub.shutting_down and self.delivery is None:
                self.failure = server_stopping()
                self._queue.put_nowait(_Failure(self.failure))
            else:
                self.failure = _ClientGone()
        except Exception as exc:
            self.failure = exc
            self.t_engine_end = time.monotonic()
            self._queue.put_nowait(_Failure(exc))
        finally:
            self._engine_done = True
            self._queue.put_nowait(END)
            self._maybe_settle()

    def _log_scheduling(self, event: ChatEvent) -> None:
        """request_scheduling: one pause-cycle boundary, written on this consumer task."""
        if event.scheduling is not None:
            body = records.scheduling_body(self.request_id, event.scheduling)
            self.hub.request_log.write("request_scheduling", body)

    def _observe(self, event: ChatEvent) -> None:
        kind = event.kind
        if kind == "submitted":
            self.engine_request_id = event.request_id
            self.num_prompt = event.num_prompt
            self.t_submitted = time.monotonic()
            self.state = "waiting"
            self.hub.request_log.write("request_start", self._start_body())
        elif kind == "admitted":
            self.admitted = event.stats
            self.state = "prefilling"
        elif kind in ("reasoning", "content", "tool_call"):
            self.state = "decoding"
            self.num_tool_calls += kind == "tool_call"
        elif kind == "finished":
            self.finished = event
            self.t_engine_end = time.monotonic()
            self.state = "done"

    # -- the terminal ----------------------------------------------------------------------------
    def _maybe_settle(self) -> None:
        if self._settled or not self._engine_done or self.delivery is None:
            return
        self._settled = True
        if self.engine_request_id is None:
            outcome = self._settle_rejected()
        elif self.finished is not None:
            outcome = self._settle_done()
        else:
            outcome = self._settle_error()
        self.hub.metrics.requests[outcome] += 1
        self.hub.settled(self, outcome)

    def _base(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "protocol": self.shape.protocol,
            "stream": self.shape.stream,
        }

    def _start_body(self) -> dict[str, Any]:
        assert self.t_submitted is not None
        return {
            **self.shape.to_json(),
            "request_id": self.request_id,
            "prompt_tokens": self.num_prompt,
            "prepare_seconds": self.t_submitted - self.t_start,
        }

    def _settle_rejected(self) -> str:
        failure = self.failure
        if isinstance(failure, _ClientGone) or failure is None:
            error = ProtocolError(
                "the request was abandoned during preparation",
                status=CLIENT_CLOSED,
                code="client_disconnected" if self.delivery == "client_gone" else "server_stopping",
            )
        else:
            error = self.error or self.response_failure or self._wire.error(failure)
        total = time.monotonic() - self.t_start
        body = records.rejected_body({**self.shape.to_json(), **self._base()}, error, total)
        self.hub.request_log.write("request_rejected", body)
        self._line(error.status, f"rejected code={error.code} total={seconds(total)}")
        return "rejected"

    def _status(self) -> int:
        if self.delivery != "delivered":
            return CLIENT_CLOSED
        if self.response_failure is not None:
            return self.response_failure.status
        return 200

    def _settle_done(self) -> str:
        fin = self.finished
        assert fin is not None and fin.usage is not None
        reason = fin.finish_reason.value if fin.finish_reason is not None else "stop"
        outcome = "cancelled" if reason == "cancelled" else "completed"
        status = self._status()
        end = self.t_engine_end or time.monotonic()
        total = end - self.t_start
        times = records.StageTimes.of(fin.stats, self.t_start, self.t_submitted, end)
        metrics = self.hub.metrics
        if outcome == "completed" and status != 200:
            metrics.response_failures += 1
        metrics.duration.observe(total)
        metrics.queue.observe(times.queue_wait)
        if times.ttft is not None:
            metrics.ttft.observe(times.ttft)
        body = records.done_body(
            self._base(),
            fin,
            times,
            status=status,
            delivery=self.delivery,
            response_failure=self.response_failure,
            num_tool_calls=self.num_tool_calls,
            total=total,
        )
        self.hub.request_log.write("request_done", body)
        usage = fin.usage
        rate = fin.timings.predicted_per_second if fin.timings is not None else 0.0
        code = f" code={self.response_failure.code}" if self.response_failure else ""
        self._line(
            status,
            f"delivery={self.delivery}{code} finish={reason} queue={seconds(times.queue_wait)} "
            f"prompt={usage.prompt_tokens} cached={usage.cached_tokens} "
            f"completion={usage.completion_tokens} decode={rate:.1f}tok/s "
            f"ttft={seconds(times.ttft)} total={seconds(total)}",
        )
        return outcome

    def _settle_error(self) -> str:
        failure = self.failure
        error = self.error or (
            self._wire.error(failure) if failure is not None else to_protocol_error(RuntimeError())
        )
        end = self.t_engine_end or time.monotonic()
        total = end - self.t_start
        body = records.error_body(
            {**self.shape.to_json(), **self._base()},
            error,
            delivery=self.delivery,
            admitted=self.admitted,
            prompt_tokens=self.num_prompt,
            prepare=(self.t_submitted or end) - self.t_start,
            total=total,
        )
        self.hub.request_log.write("request_error", body)
        queue = body["engine_timing"]["queue_wait_seconds"]
        self._line(
            error.status,
            f"delivery={self.delivery} code={error.code} queue={seconds(queue)} "
            f"prompt={self.num_prompt} total={seconds(total)}",
        )
        return "failed"

    def _line(self, status: int, detail: str) -> None:
        mode = "stream" if self.shape.stream else "aggregate"
        log.log(
            level_for_status(status),
            "request %s %s %s status=%d %s",
            self.request_id, API_NAMES[self.shape.protocol], mode, status, detail,
        )  # fmt: skip
