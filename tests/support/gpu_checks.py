"""Shared helpers of the kernel tests: the relative-error metric and CUDA-graph capture.

The metric is the one docs/kernels.md states tolerances in: ||a - b|| / ||b|| over the whole
tensor, in float64 on the CPU (so a GPU result compares with a CPU twin directly), after checking
that the result under test has no NaN (a NaN would otherwise make the comparison fail silently
true or false depending on the operator).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64; `a` is the result under test and must hold no NaN."""
    assert not a.isnan().any(), "NaN in the result under test"
    a64, b64 = a.double().cpu(), b.double().cpu()
    return ((a64 - b64).norm() / b64.norm()).item()


def capture_graph(fn: Callable[[], Any]) -> tuple[torch.cuda.CUDAGraph, Any]:
    """A CUDA graph of fn() and its captured result; fn runs once eagerly on a side stream first,
    so compilation and allocations happen outside the capture."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = fn()
    return graph, result
