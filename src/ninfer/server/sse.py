"""Server-sent-event framing and the idle heartbeat shared by the streaming endpoints.

No sanic import: handlers write the bytes. The heartbeat waits on the event source through a
task instead of `wait_for`, because timing out `wait_for` would cancel the source's pending step
(and with it the engine request); here an idle interval only yields None.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

DONE = b"data: [DONE]\n\n"
PREFIX_CACHE_HEADER = "x-ninfer-prefix-cache"  # every generation response: hit or why a miss
KEEPALIVE = b": keep-alive\n\n"
END: Any = object()  # `anext(source, END)`: the source is exhausted


def prefix_headers(*events: Any) -> dict[str, str]:
    """The prefix-cache header from the first event that carries it (admission, terminal)."""
    for event in events:
        value = getattr(event, "prefix_cache", None)
        if value:
            return {PREFIX_CACHE_HEADER: value}
    return {}


def data_frame(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


async def with_heartbeat(source: AsyncIterator[T], interval_s: float) -> AsyncIterator[T | None]:
    """Yield `source`'s items, and None after every `interval_s` seconds without one.

    Closing or cancelling this generator closes `source` (its cleanup cancels the engine request).
    """
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(_next(source))
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield None
                continue
            step, pending = pending, None
            try:
                item = step.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None:
            pending.cancel()  # the source's own cleanup runs inside the cancelled step
            with contextlib.suppress(BaseException):
                await asyncio.wait({pending})
        else:
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()


async def _next(source: AsyncIterator[T]) -> T:
    return await anext(source)


async def next_event(source: AsyncIterator[T | None]) -> T | None:
    """The next real item of a heartbeat source (idle Nones skipped); None when it ends."""
    async for item in source:
        if item is not None:
            return item
    return None


Handler = Callable[[T | None, AsyncIterator[T | None]], Awaitable[R]]


async def serve_events(
    events: AsyncIterator[T],
    keepalive_s: float,
    *,
    stream: bool,
    on_stream: Handler[T, None],
    on_aggregate: Handler[T, R],
    on_disconnect: Callable[[], None],
) -> R | None:
    """The life of one generation response, shared by every API family.

    The first real event is awaited before anything is written, so admission errors (overload,
    queue timeout, context length) still become ordinary HTTP errors. A client that goes away
    cancels the handler; closing the heartbeat source then cancels the engine request.
    """
    source = with_heartbeat(events, keepalive_s)
    try:
        first = await next_event(source)
        if stream:
            await on_stream(first, source)
            return None
        return await on_aggregate(first, source)
    except asyncio.CancelledError:
        on_disconnect()
        raise
    finally:
        await source.aclose()
