"""Shared helpers of the kernel tests: the relative-error metric, CUDA-graph capture, and the
bf16 GEMV kernels' operands and product bounds, the int4 kernels' operands, the fp8 GEMVs'
decode shapes and block-quantized weights.

The metric is the one docs/kernels.md states tolerances in: ||a - b|| / ||b|| over the whole
tensor, in float64 on the CPU (so a GPU result compares with a CPU twin directly), after checking
that the result under test has no NaN (a NaN would otherwise make the comparison fail silently
true or false depending on the operator).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ninfer.artifact.quantize import quantize_fp8_block
from ninfer.kernels.fp8_gemv.reference import Fp8Weight


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


# The bf16 GEMV kernels' product checks (test_bf16_gemv_gpu.py, test_bf16_mma_gemv_gpu.py): each
# output is fp32 sums of exact bf16 products rounded once, so against the fp64 product every
# element obeys |got - exact| <= 2^-8 |exact| + 2e-5 sum |x| |w| (half a bf16 ulp, plus the fp32
# summation slack), and the norm-relative error is held to 1e-2.
BF16_TOL = 1e-2
BF16_ULP_BOUND = 2.0**-8
BF16_SUM_SLACK = 2e-5


def bf16_operands(
    rows: int, n: int, k: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random bf16 x [rows, k] and W [n, k] on CUDA, W's rows of different magnitude."""
    x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(n, k, device="cuda", generator=gen) * k**-0.5
    w *= torch.rand(n, 1, device="cuda", generator=gen) * 4
    return x, w.to(torch.bfloat16)


def check_bf16_product(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    """Shape, dtype, the element bound and the norm bound of x @ w.T against fp64."""
    assert got.shape == (x.shape[0], w.shape[0]) and got.dtype == torch.bfloat16
    exact = x.double() @ w.double().T
    scale = x.double().abs() @ w.double().abs().T
    err = (got.double() - exact).abs()
    bound = BF16_ULP_BOUND * exact.abs() + BF16_SUM_SLACK * scale
    worst = (err - bound).max().item()
    assert worst <= 0, f"element bound exceeded by {worst:.3e}"
    assert rel(got, exact) < BF16_TOL


def int4_operands(
    rows: int, hidden: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random packed int4 rows [rows, hidden / 2] and fp32 group scales [rows, hidden / 64] on
    CUDA: scales of different magnitude per row and group, never zero."""
    packed = torch.randint(
        0, 256, (rows, hidden // 2), dtype=torch.uint8, device="cuda", generator=gen
    )
    scale = torch.rand(rows, hidden // 64, device="cuda", generator=gen) * 0.05 + 1e-3
    return packed, scale


# The 27B's fp8 decode projections (gate-up, down, DeltaNet in_proj, out_proj, attention qkv),
# then shapes off the 128 grid: N tails, K tails (4112 = 32 * 128 + 16), short rows (K = 64:
# fewer 16-byte chunks than a warp), a single output row
FP8_SHAPES = [
    (34816, 5120),
    (5120, 17408),
    (16480, 5120),
    (5120, 6144),
    (14336, 5120),
    (1000, 272),
    (130, 4112),
    (48, 64),
    (1, 16),
]
_FP8_WEIGHTS: dict[tuple[int, int], Fp8Weight] = {}


def fp8_weight(n: int, k: int) -> Fp8Weight:
    """A fresh random [n, k] weight, rows of different magnitude, block-quantized to fp8 on the
    GPU (an `Fp8Weight`); made once per shape and test session (the 27B shapes take ~0.5 GB)."""
    if (n, k) not in _FP8_WEIGHTS:
        gen = torch.Generator("cuda").manual_seed(torch.seed() % 2**31)
        w = torch.randn(n, k, device="cuda", generator=gen) * k**-0.5
        w *= torch.rand(n, 1, device="cuda", generator=gen) * 4
        _FP8_WEIGHTS[(n, k)] = Fp8Weight(*quantize_fp8_block(w))
    return _FP8_WEIGHTS[(n, k)]


def fp8_hard_rows(
    rows: int, k: int, gen: torch.Generator, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """x rows for the fp8 GEMVs' per-row scaling: row r gets pattern (r + rows) % 4, so one row
    already sees entries beyond f16's 65,504 (with tiny ones), a row below f16's subnormals, or
    a row of 1e30 with tiny entries."""
    x = torch.randn(rows, k, device="cuda", generator=gen)
    for r in range(rows):
        pattern = (r + rows) % 4
        if pattern == 1:
            x[r, ::29] *= 3e5
            x[r, 5::31] *= 1e-7
        elif pattern == 2:
            x[r] *= 1e-30
        elif pattern == 3:
            x[r] *= 1e30
            x[r, ::3] *= 1e-33
    return x.to(dtype)
