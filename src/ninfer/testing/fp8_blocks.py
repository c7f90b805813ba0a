"""Block fp8 quantisation in the Hugging Face / DeepSeek-V3 format real Qwen fp8 checkpoints use.

Owns `quantize_fp8_blocks` and the `quantization_config` dict; imports only torch. A weight
`[..., N, K]` becomes float8_e4m3fn values plus `weight_scale_inv` `[..., ceil(N/128), ceil(K/128)]`
with `weight ~= q * scale_inv` per 128 x 128 block; the scale maps each block's absmax onto the
e4m3 maximum (448) so no value saturates and small blocks keep their precision.
"""

from __future__ import annotations

from typing import Any

import torch

FP8_BLOCK = 128
FP8_MAX = 448.0  # largest finite float8_e4m3fn


def quantize_fp8_blocks(
    weight: torch.Tensor, *, scale_dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise `[..., N, K]` to e4m3 `[..., N, K]` and scale_inv `[..., ceil(N/128), ceil(K/128)]`.

    Partial edge blocks are padded with zeros for the absmax, which leaves their scale unchanged.
    The scale is rounded to `scale_dtype` first and the values divided by the rounded scale, so
    dequantising with the stored scale is exact up to e4m3 rounding.
    """
    w = weight.float()
    *batch, n, k = w.shape
    num_row_blocks, num_col_blocks = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
    padded = torch.zeros(*batch, num_row_blocks * FP8_BLOCK, num_col_blocks * FP8_BLOCK)
    padded[..., :n, :k] = w
    # [..., Nb*128, Kb*128] -> [..., Nb, 128, Kb, 128]
    blocks = padded.unflatten(-1, (num_col_blocks, FP8_BLOCK))
    blocks = blocks.unflatten(-3, (num_row_blocks, FP8_BLOCK))
    absmax = blocks.abs().amax(dim=(-3, -1))  # [..., Nb, Kb]
    scale = (absmax / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny).to(scale_dtype)
    # [..., Nb, Kb] -> [..., N, K]: each scale repeated over its block, cropped at the edges.
    scale_full = scale.float().repeat_interleave(FP8_BLOCK, -2).repeat_interleave(FP8_BLOCK, -1)
    scale_full = scale_full[..., :n, :k]
    q = (w / scale_full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def fp8_quantization_config(modules_to_not_convert: list[str]) -> dict[str, Any]:
    """`quantization_config` as real Qwen fp8 checkpoints write it: dynamic activations, e4m3,
    128 x 128 weight blocks, and the full names of the Linear-like modules left unquantised."""
    return {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "modules_to_not_convert": modules_to_not_convert,
        "quant_method": "fp8",
        "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
    }
