"""The fp8 weight-only GEMV kernel against its torch twin and an fp64 product (GPU only).

Fresh random weights are quantized on the GPU (`artifact.quantize.quantize_fp8_block`). bf16
outputs within 1e-2 relative (norm of the difference over the norm of the reference), fp32 within
1e-4; shapes cover the 27B's projections, N off the 128-row grid, K off the 128-column grid, and
every row count the kernel serves.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.artifact.quantize import quantize_fp8_block
from ninfer.kernels import dispatch
from ninfer.kernels.fp8_gemv import launch as fp8_cuda
from ninfer.kernels.fp8_gemv import reference as fp8_ref
from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from support.gpu_checks import rel

pytestmark = pytest.mark.gpu
TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-4}


def _weight(n: int, k: int, gen: torch.Generator) -> Fp8Weight:
    w = torch.randn(n, k, device="cuda", generator=gen) * k**-0.5
    w *= torch.rand(n, 1, device="cuda", generator=gen) * 4  # rows of different magnitude
    return Fp8Weight(*quantize_fp8_block(w))


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator("cuda").manual_seed(1234)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
@pytest.mark.parametrize("n,k", [(12288, 5120), (5120, 17408), (1000, 272), (48, 64)])
def test_fp8_gemv_matches_twin(dtype, rows: int, n: int, k: int, gen) -> None:
    w = _weight(n, k, gen)
    x = torch.randn(rows, k, device="cuda", generator=gen).to(dtype)
    assert fp8_cuda.supports(x, w)
    got = fp8_cuda.fp8_linear(x, w)
    assert got.shape == (rows, n) and got.dtype == dtype
    exact = x.double() @ fp8_ref.dequantize(w.weight, w.scale_inv, torch.float64).T
    assert rel(got, fp8_ref.fp8_linear(x, w)) < TOL[dtype]
    assert rel(got, exact) < TOL[dtype]


def test_dispatch_takes_the_kernel_for_decode_and_strided_rows(gen) -> None:
    w = _weight(640, 256, gen)
    wide = torch.randn(3, 512, device="cuda", generator=gen).to(torch.bfloat16)
    x = wide[:, 128:384]  # a column slice: rows are not dense in memory
    want = fp8_ref.fp8_linear(x.contiguous(), w)
    assert rel(dispatch.linear(x, w), want) < 1e-2
    prefill = torch.randn(40, 256, device="cuda", generator=gen).to(torch.bfloat16)
    assert not fp8_cuda.supports(prefill, w)  # more rows than a decode batch: the twin
    assert rel(dispatch.linear(prefill, w), fp8_ref.fp8_linear(prefill, w)) < 1e-6


def test_fp8_gemv_row_views_of_a_fused_weight(gen) -> None:
    fused = _weight(384, 128, gen)
    part = fused.rows(256, 384)  # the last 128 rows: a view with its own scale rows
    x = torch.randn(1, 128, device="cuda", generator=gen).to(torch.bfloat16)
    assert rel(fp8_cuda.fp8_linear(x, part), fp8_cuda.fp8_linear(x, fused)[:, 256:]) < 1e-6
