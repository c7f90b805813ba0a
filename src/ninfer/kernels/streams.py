"""A fork onto a side stream and back, for two launches that only share their input.

Imports torch only. Why: a small projection whose weight cannot join a large one's launch (the
fp8 DeltaNet's bf16 b/a rows beside its e4m3 qkv/z rows) costs the decode step a launch and a
dependency of its own, ~2.5 µs at one row and ~6 µs at an MTP verify's four (run S46A, H100:
0.12 ms of the fp8 step, 0.30 ms of its verify). Forked, it runs inside the large GEMV's time.
Inside a `torch.cuda.graph` capture the fork and the join become graph edges, so a replay keeps
the overlap.

Memory: the side stream always waits for the main stream first and the main stream waits for
the side stream before it goes on, so every block the caching allocator hands out on either
stream is reused only after the other stream's reads of it are ordered before that reuse; no
`record_stream` is needed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

A = TypeVar("A")
B = TypeVar("B")

_SIDE: dict[int, torch.cuda.Stream] = {}


def side_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device, made on first use (a new stream per call would leak
    streams into every captured graph)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE:
        _SIDE[index] = torch.cuda.Stream(device=index)
    return _SIDE[index]


def _fork(device: torch.device) -> torch.cuda.Stream | None:
    """The side stream, ordered after what the current stream holds; None when the current
    stream is the side stream itself (a caller's own fork): then there is nothing to fork."""
    current = torch.cuda.current_stream(device)
    other = side_stream(device)
    if other == current:
        return None
    other.wait_stream(current)
    return other


def beside(main: Callable[[], A], side: Callable[[], B], device: torch.device) -> tuple[A, B]:
    """(main(), side()) with `side`'s launches on the side stream, both ordered after what the
    current stream holds and before what it gets next. `side` is enqueued first so its few
    blocks are placed before `main`'s grid fills the GPU."""
    other = _fork(device)
    if other is None:
        return main(), side()
    with torch.cuda.stream(other):
        side_out = side()
    main_out = main()
    torch.cuda.current_stream(device).wait_stream(other)
    return main_out, side_out


class Ahead:
    """Work forked onto the side stream by `ahead`; `join()` orders the current stream after
    it (a capture must join every fork before it ends)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def join(self) -> None:
        torch.cuda.current_stream(self.device).wait_stream(side_stream(self.device))


def ahead(work: Callable[[], object], device: torch.device) -> Ahead | None:
    """`work()`'s launches on the side stream after what the current stream holds, while the
    current stream goes on until the caller joins; None (work not run) on the side stream
    itself. Why: a prefetch of a later GEMV's weights beside the small kernels before it."""
    other = _fork(device)
    if other is None:
        return None
    with torch.cuda.stream(other):
        work()
    return Ahead(device)
