"""SSE framing and the idle heartbeat: idle yields None, the source is never cancelled by it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

from ninfer.server.sse import DONE, KEEPALIVE, data_frame, with_heartbeat


def test_frames() -> None:
    frame = data_frame({"a": "é", "b": [1]})
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    assert json.loads(frame[6:]) == {"a": "é", "b": [1]}
    assert "é" in frame.decode()  # not \u-escaped
    assert DONE == b"data: [DONE]\n\n"
    assert KEEPALIVE.startswith(b":")  # an SSE comment


def test_heartbeat_on_idle_without_cancelling_the_source() -> None:
    async def main() -> tuple[list, list[str]]:
        release = asyncio.Event()
        trace: list[str] = []

        async def source() -> AsyncIterator[int]:
            try:
                yield 1
                await release.wait()  # idle: the heartbeat must not cancel this wait
                yield 2
            except asyncio.CancelledError:
                trace.append("cancelled")
                raise
            finally:
                trace.append("closed")

        out: list = []
        async for item in with_heartbeat(source(), 0.001):
            out.append(item)
            if item is None and not release.is_set():
                release.set()
        return out, trace

    out, trace = asyncio.run(main())
    assert out[0] == 1 and out[-1] == 2
    assert None in out[1:-1] and set(out[1:-1]) == {None}
    assert trace == ["closed"]


def test_closing_the_heartbeat_closes_a_waiting_source() -> None:
    async def main() -> list[str]:
        trace: list[str] = []

        async def source() -> AsyncIterator[int]:
            try:
                yield 1
                await asyncio.Event().wait()  # never ends by itself
                yield 2
            except asyncio.CancelledError:
                trace.append("cancelled")
                raise
            finally:
                trace.append("closed")

        beat = with_heartbeat(source(), 0.001)
        assert await anext(beat) == 1
        assert await anext(beat) is None  # the source is now parked in its wait
        await beat.aclose()
        return trace

    assert asyncio.run(main()) == ["cancelled", "closed"]


def test_closing_between_items_closes_the_source() -> None:
    async def main() -> list[str]:
        trace: list[str] = []

        async def source() -> AsyncIterator[int]:
            try:
                yield 1
                yield 2
            finally:
                trace.append("closed")

        beat = with_heartbeat(source(), 10.0)
        assert await anext(beat) == 1
        await beat.aclose()
        return trace

    assert asyncio.run(main()) == ["closed"]


def test_source_errors_propagate() -> None:
    async def main() -> None:
        async def source() -> AsyncIterator[int]:
            raise ValueError("boom")
            yield 1  # pragma: no cover

        async for _ in with_heartbeat(source(), 10.0):
            pass

    try:
        asyncio.run(main())
    except ValueError as e:
        assert str(e) == "boom"
    else:
        raise AssertionError("the source's error was swallowed")
