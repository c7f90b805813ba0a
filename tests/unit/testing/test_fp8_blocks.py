"""Block fp8 quantisation against the e4m3 format's own error bounds.

The reference dequantiser below walks the 128 x 128 blocks one by one; it shares no code with
`quantize_fp8_blocks`.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.testing.fp8_blocks import fp8_quantization_config, quantize_fp8_blocks

BLOCK = 128
E4M3_MAX = 448.0


def _dequantize_reference(q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    out = torch.empty(q.shape)
    n, k = q.shape
    for bi in range(-(-n // BLOCK)):
        for bj in range(-(-k // BLOCK)):
            rows = slice(bi * BLOCK, min((bi + 1) * BLOCK, n))
            cols = slice(bj * BLOCK, min((bj + 1) * BLOCK, k))
            out[rows, cols] = q[rows, cols].float() * scale_inv[bi, bj].float()
    return out


def _assert_within_e4m3_error(w: torch.Tensor, q: torch.Tensor, scale_inv: torch.Tensor) -> None:
    """Round-to-nearest e4m3: relative error <= 2^-4 for normals, absolute <= 2^-10 * scale for
    subnormals (half the smallest subnormal step 2^-9)."""
    deq = _dequantize_reference(q, scale_inv)
    scale_full = _dequantize_reference(torch.ones(q.shape), scale_inv)
    bound = 2.0**-4 * w.abs() + 2.0**-10 * scale_full + 1e-7
    assert torch.all((deq - w).abs() <= bound)


@pytest.mark.parametrize(
    "shape",
    [(300, 200), (64, 64), (128, 256), (1, 513)],
    ids=["partial", "one-block", "exact", "row"],
)
def test_dequantised_weight_is_within_e4m3_error(shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(shape, generator=gen)
    # Give each block a different magnitude so a misplaced scale cannot pass.
    w *= torch.exp(torch.randn(shape[0], 1, generator=gen)) * torch.exp(
        torch.randn(1, shape[1], generator=gen)
    )
    q, scale_inv = quantize_fp8_blocks(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert scale_inv.dtype == torch.float32
    assert scale_inv.shape == (-(-shape[0] // BLOCK), -(-shape[1] // BLOCK))
    _assert_within_e4m3_error(w, q, scale_inv)


def test_each_block_uses_the_full_e4m3_range() -> None:
    w = torch.randn(256, 384, generator=torch.Generator().manual_seed(2))
    q, _ = quantize_fp8_blocks(w)
    block_max = q.float().abs().unflatten(1, (3, BLOCK)).unflatten(0, (2, BLOCK)).amax(dim=(1, 3))
    assert torch.equal(block_max, torch.full((2, 3), E4M3_MAX))


def test_batched_experts_quantise_like_each_expert_alone() -> None:
    w = torch.randn(3, 200, 72, generator=torch.Generator().manual_seed(3))
    q, scale_inv = quantize_fp8_blocks(w)
    assert scale_inv.shape == (3, 2, 1)
    for e in range(3):
        q_e, scale_e = quantize_fp8_blocks(w[e])
        assert torch.equal(q[e].float(), q_e.float())
        assert torch.equal(scale_inv[e], scale_e)


def test_bfloat16_scales_still_dequantise_within_bounds() -> None:
    w = torch.randn(130, 260, generator=torch.Generator().manual_seed(4))
    q, scale_inv = quantize_fp8_blocks(w, scale_dtype=torch.bfloat16)
    assert scale_inv.dtype == torch.bfloat16
    _assert_within_e4m3_error(w, q, scale_inv)


def test_zero_block_dequantises_to_zero() -> None:
    w = torch.zeros(128, 256)
    w[:, 128:] = 1.0
    q, scale_inv = quantize_fp8_blocks(w)
    assert torch.equal(_dequantize_reference(q, scale_inv), w)


def test_quantization_config_matches_real_fp8_checkpoints() -> None:
    config = fp8_quantization_config(["lm_head"])
    assert config == {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "modules_to_not_convert": ["lm_head"],
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    }
