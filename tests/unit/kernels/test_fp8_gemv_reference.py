"""The fp8 GEMV's torch twin and block dequantisation against the converter's quantizer (CPU).

The independent reference is `artifact.quantize.dequantize_fp8_block` (a separate implementation
of the same format): both must give the same fp32 values bit for bit, aligned or not.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.artifact.quantize import dequantize_fp8_block, quantize_fp8_block
from ninfer.kernels import dispatch
from ninfer.kernels.fp8_gemv.reference import Fp8Weight, dequantize, fp8_linear


def _fp8(n: int, k: int, seed: int) -> tuple[torch.Tensor, Fp8Weight]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g) * 3
    q, s = quantize_fp8_block(w)
    return w, Fp8Weight(q, s)


@pytest.mark.parametrize("n,k", [(256, 384), (200, 272), (5, 48), (128, 130)])
def test_dequantize_equals_the_converters_inverse(n: int, k: int) -> None:
    w, fp8 = _fp8(n, k, seed=n + k)
    want = dequantize_fp8_block(fp8.weight, fp8.scale_inv, torch.float32)
    got = dequantize(fp8.weight, fp8.scale_inv, torch.float32)
    assert torch.equal(got, want)
    # and it is a quantisation of w: e4m3 keeps 3 mantissa bits (relative step 2^-4 at worst)
    assert ((got - w).abs() <= w.abs() * 2**-4 + fp8.scale_inv.max() * 2**-9).all()
    bf16 = dequantize(fp8.weight, fp8.scale_inv, torch.bfloat16)
    assert torch.equal(bf16, want.to(torch.bfloat16))


@pytest.mark.parametrize("rows", [1, 3, 17])
def test_twin_is_dequantize_then_matmul(rows: int) -> None:
    _, fp8 = _fp8(200, 272, seed=rows)
    x = torch.randn(rows, 272, generator=torch.Generator().manual_seed(9))
    want = x @ dequantize_fp8_block(fp8.weight, fp8.scale_inv, torch.float32).T
    torch.testing.assert_close(fp8_linear(x, fp8), want, rtol=1e-5, atol=1e-5)
    # dispatch on CPU tensors runs the twin, and plain weights stay plain matmuls
    torch.testing.assert_close(dispatch.linear(x, fp8), want, rtol=1e-5, atol=1e-5)
    dense = torch.randn(7, 272)
    assert torch.equal(dispatch.linear(x, dense), torch.nn.functional.linear(x, dense))


def test_row_views_split_on_block_edges_only() -> None:
    _, fp8 = _fp8(300, 64, seed=1)
    part = fp8.rows(128, 300)
    assert part.shape == (172, 64) and part.scale_inv.shape == (2, 1)
    full = dequantize(fp8.weight, fp8.scale_inv, torch.float32)
    assert torch.equal(dequantize(part.weight, part.scale_inv, torch.float32), full[128:300])
    with pytest.raises(ValueError, match="block edge"):
        fp8.rows(100, 300)
