"""FP8 e4m3 weights with 128x128 block scales (the layout of Hugging Face FP8 Qwen checkpoints).

A weight [..., N, K] is cut into 128x128 blocks (the last block of a dimension may be short); each
block stores e4m3 values and one f32 scale that multiplies them back (`weight_scale_inv` in HF
terms). Scales are [..., ceil(N/128), ceil(K/128)].
"""

from __future__ import annotations

import torch

from ninfer.artifact.format import FP8_BLOCK

E4M3_MAX = 448.0


def _blocked(x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    n, k = x.shape[-2:]
    nb, kb = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
    pad = torch.nn.functional.pad(x, (0, kb * FP8_BLOCK - k, 0, nb * FP8_BLOCK - n))
    # [..., nb*128, kb*128] -> [..., nb, 128, kb, 128]
    return pad.reshape(*x.shape[:-2], nb, FP8_BLOCK, kb, FP8_BLOCK), n, k


def quantize_fp8_block(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize to (e4m3 values of w's shape, f32 scales [..., ceil(N/128), ceil(K/128)])."""
    blocks, n, k = _blocked(w.float())
    amax = blocks.abs().amax(dim=(-3, -1), keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (blocks / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    nb, kb = blocks.shape[-4], blocks.shape[-2]
    q = q.reshape(*w.shape[:-2], nb * FP8_BLOCK, kb * FP8_BLOCK)[..., :n, :k].contiguous()
    return q, scale.reshape(*w.shape[:-2], nb, kb).contiguous()


def dequantize_fp8_block(
    q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Inverse of `quantize_fp8_block` (exact up to the final cast to `dtype`)."""
    n, k = q.shape[-2:]
    full = scale.repeat_interleave(FP8_BLOCK, dim=-2).repeat_interleave(FP8_BLOCK, dim=-1)
    return (q.float() * full[..., :n, :k]).to(dtype)
