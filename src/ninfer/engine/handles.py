"""Request handles: turn the worker thread's events into a blocking or an asyncio iterator.

The worker calls a handle's sink, which only enqueues (never blocks the device loop). A sync handle
uses a thread-safe queue; an async handle hops onto its event loop with call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from ninfer.engine.request import EngineEvent, GenerationRequest

if TYPE_CHECKING:
    from ninfer.engine.core import EngineCore


class RequestHandle:
    """Blocking iterator over one request's events; cancels the request if abandoned."""

    def __init__(self, core: EngineCore, request: GenerationRequest) -> None:
        self._core = core
        self._queue: queue.SimpleQueue[EngineEvent] = queue.SimpleQueue()
        self.request_id = core.submit(request, self._queue.put)
        self.done = False

    def __iter__(self) -> Iterator[EngineEvent]:
        try:
            while not self.done:
                event = self._queue.get()
                self.done = event.is_terminal
                yield event
        finally:
            if not self.done:
                self.cancel()

    def cancel(self) -> None:
        self._core.cancel(self.request_id)


class AsyncRequestHandle:
    """asyncio iterator over one request's events; cancels the request if abandoned."""

    def __init__(self, core: EngineCore, request: GenerationRequest) -> None:
        self._core = core
        loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[EngineEvent] = asyncio.Queue()

        def sink(event: EngineEvent) -> None:
            if not loop.is_closed():  # a closed loop has no reader left; drop the event
                loop.call_soon_threadsafe(self._queue.put_nowait, event)

        self.request_id = core.submit(request, sink)
        self.done = False

    async def __aiter__(self) -> AsyncIterator[EngineEvent]:
        try:
            while not self.done:
                event = await self._queue.get()
                self.done = event.is_terminal
                yield event
        finally:
            if not self.done:
                self.cancel()

    def cancel(self) -> None:
        self._core.cancel(self.request_id)
