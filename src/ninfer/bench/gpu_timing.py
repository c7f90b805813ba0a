"""GPU time per call of a captured function: what the kernel sweeps report (CUDA graphs, so the
launch cost on the host does not count, as inside a decode step)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

CALLS_PER_GRAPH = 20
W = TypeVar("W")


def graph_us(fn: Callable[[], object], replays: int = 10, calls: int = CALLS_PER_GRAPH) -> float:
    """Median GPU microseconds per call of `fn`, captured `calls` times in one graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up: compilation, allocator
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    times.sort()
    return times[len(times) // 2]


def rotating(fn: Callable[[W], object], weights: Sequence[W]) -> Callable[[], object]:
    """fn over the next of `weights` at each call: a graph records each call's own weight, so
    a sweep reads its weights from DRAM, as a decode step does, not from L2."""
    counter = itertools.count()
    return lambda: fn(weights[next(counter) % len(weights)])


def copies_for(nbytes: int, rotate_bytes: int, max_copies: int) -> int:
    """How many copies of an `nbytes` weight a sweep cycles through so that they span
    `rotate_bytes` (several times the L2), at most `max_copies`."""
    return min(max_copies, -(-rotate_bytes // nbytes))


def bf16_weight_copies(
    n: int, k: int, device: torch.device, *, rotate_bytes: int, max_copies: int
) -> list[torch.Tensor]:
    """Random bf16 [n, k] weights (scaled by k^-0.5), `copies_for` many, for `rotating`: the
    first drawn as float then rounded, the others drawn in bf16 (as the GEMV sweeps did)."""
    weights = [(torch.randn(n, k, device=device) * k**-0.5).to(torch.bfloat16)]
    copies = copies_for(2 * n * k, rotate_bytes, max_copies)
    weights += [torch.randn_like(weights[0]) * k**-0.5 for _ in range(copies - 1)]
    return weights
