"""The fp8 prefill GEMM's torch twins on the CPU: activation quantisation, dequantisation, GEMM.

Independent references: the nearest e4m3 value found by brute force over all 254 finite codes (for
the quantizer's rounding), per-group amax taken group by group in a Python loop (for the scales),
the converter's `dequantize_fp8_block` and the GEMV's `dequantize` (for the weight), and an fp64
product with the unquantized x (for what activation quantisation costs, bounded from theory).
"""

from __future__ import annotations

import pytest
import torch

from ninfer.artifact.quantize import dequantize_fp8_block, quantize_fp8_block
from ninfer.kernels import dispatch
from ninfer.kernels.fp8_gemm import reference as ref
from ninfer.kernels.fp8_gemv import reference as gemv_ref
from ninfer.kernels.fp8_gemv.reference import Fp8Weight

# every finite e4m3fn value (codes 0x7f and 0xff are NaN)
_CODES = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
E4M3_VALUES = _CODES.view(torch.float8_e4m3fn).double()


def _x(m: int, k: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # rows and columns of different magnitude, so groups get different scales
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4
    return (x * torch.exp(torch.randn(1, k, generator=g))).to(dtype)


def _outer_dim_major(scales: torch.Tensor) -> bool:
    """The layout `_scaled_mm` checks for 1x128 scales (a size-1 dimension's stride is free)."""
    rows, groups = scales.shape
    return (rows <= 1 or scales.stride(0) == 1) and (groups <= 1 or scales.stride(1) == rows)


def _weight(n: int, k: int, seed: int) -> Fp8Weight:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * k**-0.5 * (torch.rand(n, 1, generator=g) + 0.5)
    return Fp8Weight(*quantize_fp8_block(w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("m,k", [(6, 384), (5, 300), (3, 64), (1, 129)])
def test_quantize_picks_the_nearest_e4m3_with_amax_scales(dtype, m: int, k: int) -> None:
    x = _x(m, k, seed=m * k, dtype=dtype)
    act = ref.quantize_activations(x)
    num_groups = -(-k // 128)
    assert act.values.shape == (m, k) and act.values.dtype == torch.float8_e4m3fn
    assert act.scales.shape == (m, num_groups) and _outer_dim_major(act.scales)
    xf = x.double()
    for g in range(num_groups):
        cols = slice(128 * g, min(k, 128 * g + 128))
        amax = xf[:, cols].abs().amax(dim=1)
        assert torch.equal(act.scales[:, g], (amax / 448).float())  # correctly rounded
        # every value is an e4m3 value nearest to x / scale, up to the fp32 rounding of the
        # quotient (which can land a near-tie on the tie; ties go to even)
        target = xf[:, cols] / act.scales[:, g : g + 1].double()
        dist = (target[..., None] - E4M3_VALUES).abs().min(dim=-1).values
        got_dist = (target - act.values[:, cols].double()).abs()
        assert (got_dist <= dist + target.abs() * 2**-23).all()
        assert (act.values[:, cols].double().abs().amax(dim=1) == 448).all()  # amax maps to 448


@pytest.mark.parametrize("k", [256, 300])
def test_quantize_round_trip_is_within_e4m3_precision(k: int) -> None:
    x = _x(9, k, seed=k)
    act = ref.quantize_activations(x)
    back = ref.dequantize_activations(act)
    per_col = act.scales.repeat_interleave(128, dim=1)[:, :k]
    # normal range: half a step of 3 mantissa bits (2^-4 of the value); subnormal: 2^-10 * scale
    assert ((back - x).abs() <= x.abs() * 2**-4 + per_col * 2**-10).all()
    rms = ((back - x).norm() / x.norm()).item()
    assert 0.015 < rms < 0.035  # ~2^-3 / sqrt(24) = 0.0255 for mantissas spread over a binade


def test_zero_groups_and_padding_rows_are_exact_zeros_with_unit_scale() -> None:
    x = _x(5, 384, seed=3)
    x[1] = 0.0  # a zero row
    x[3, 128:256] = 0.0  # one zero group
    act = ref.quantize_activations(x, row_multiple=4)
    assert act.values.shape == (8, 384) and act.scales.shape == (8, 3)
    assert _outer_dim_major(act.scales)
    raw = act.values.view(torch.uint8)
    assert (raw[1] == 0).all() and (raw[3, 128:256] == 0).all() and (raw[5:] == 0).all()
    assert (act.scales[1] == 1).all() and act.scales[3, 1] == 1 and (act.scales[5:] == 1).all()
    assert not act.values.float().isnan().any()
    unpadded = ref.quantize_activations(x)
    assert torch.equal(raw[:5], unpadded.values.view(torch.uint8))
    assert torch.equal(act.scales[:5], unpadded.scales)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n,k", [(256, 384), (200, 300), (5, 48), (130, 512)])
def test_dequantize_weight_matches_both_other_implementations(dtype, n: int, k: int) -> None:
    w = _weight(n, k, seed=n + k)
    got = ref.dequantize_weight(w, dtype)
    assert got.dtype == dtype
    assert torch.equal(got, gemv_ref.dequantize(w.weight, w.scale_inv, dtype))
    assert torch.equal(got, dequantize_fp8_block(w.weight, w.scale_inv, torch.float32).to(dtype))
    part = w.rows(128, n) if n > 128 else w
    assert torch.equal(ref.dequantize_weight(part, dtype), got[n - part.shape[0] :])


@pytest.mark.parametrize("m,n,k", [(40, 256, 1024), (17, 200, 300), (64, 384, 512)])
def test_fp8_gemm_twin_costs_what_activation_quantisation_should(m: int, n: int, k: int) -> None:
    x, w = _x(m, k, seed=m), _weight(n, k, seed=n)
    got = ref.fp8_gemm(x, w)
    assert got.shape == (m, n) and got.dtype == x.dtype
    w64 = dequantize_fp8_block(w.weight, w.scale_inv, torch.float64)
    # the twin is exactly "dequantized x times dequantized W"
    x_q = ref.dequantize_activations(ref.quantize_activations(x)).double()
    torch.testing.assert_close(got.double(), x_q @ w64.T, rtol=1e-5, atol=1e-5)
    # against the unquantized x: an elementwise bound from the per-element one ...
    exact = x.double() @ w64.T
    act = ref.quantize_activations(x)
    per_col = act.scales.double().repeat_interleave(128, dim=1)[:, :k]
    bound = (x.double().abs() * 2**-4 + per_col * 2**-10) @ w64.abs().T
    assert ((got.double() - exact).abs() <= bound * (1 + 1e-6) + 1e-6).all()
    # ... and the norm-wise one the GPU tests use
    err = ((got.double() - exact).norm() / exact.norm()).item()
    assert 0.01 < err < ref.ACT_QUANT_REL_ERROR


def test_bf16_twin_rounds_the_fp32_product_once() -> None:
    x, w = _x(12, 256, seed=4, dtype=torch.bfloat16), _weight(64, 256, seed=5)
    want = ref.fp8_gemm(x.float(), w).to(torch.bfloat16)  # bf16 x is exact in fp32
    assert torch.equal(ref.fp8_gemm(x, w), want)


def test_fallback_twin_and_cpu_dispatch_keep_x_unquantized() -> None:
    x, w = _x(3 * 20, 272, seed=6).reshape(3, 20, 272), _weight(200, 272, seed=7)
    want = x @ dequantize_fp8_block(w.weight, w.scale_inv, torch.float32).T
    got = ref.fp8_linear(x, w)
    assert got.shape == (3, 20, 200)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # CPU tensors never reach the CUDA GEMM: prefill-sized x runs the GEMV's twin unchanged
    flat = x.reshape(60, 272)
    assert torch.equal(dispatch.linear(flat, w), gemv_ref.fp8_linear(flat, w))
