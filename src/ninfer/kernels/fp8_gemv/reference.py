"""Torch twin of the fp8 weight-only GEMV, and the block dequantisation the model loads with.

Imports only torch. `Fp8Weight` is the bound form of an `fp8_block128` linear weight (e4m3 values
plus 128 x 128 f32 block scales, the Hugging Face `weight_scale_inv` layout). The twin dequantizes
the whole matrix to the activation dtype, then runs one cuBLAS matmul: what prefill uses on the
GPU (a scratch copy per call) and what the kernel is checked against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

BLOCK = 128


@dataclass(frozen=True)
class Fp8Weight:
    """A linear weight [N, K] kept in e4m3 with f32 scales [ceil(N/128), ceil(K/128)]."""

    weight: torch.Tensor  # [N, K] float8_e4m3fn
    scale_inv: torch.Tensor  # [ceil(N/128), ceil(K/128)] float32
    # Optional: the same values as the decode GEMV's tiles (fp8_gemv/tiles.py), bound beside the
    # row-major weight where the model packs them (`NINFER_KERNELS_ON=fp8_tiles`)
    tiles: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.weight.shape

    def rows(self, start: int, stop: int) -> Fp8Weight:
        """Rows [start, stop) as views; `start` must fall on a block edge so the scales split."""
        if start % BLOCK:
            raise ValueError(f"fp8 row slice starts at {start}, not on a {BLOCK}-row block edge")
        tiles = None if self.tiles is None else self.tiles[start // BLOCK : -(-stop // BLOCK)]
        return Fp8Weight(
            self.weight[start:stop], self.scale_inv[start // BLOCK : -(-stop // BLOCK)], tiles
        )


def dequantize(q: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[..., N, K] e4m3 times its block scale, computed in fp32 and rounded once to `dtype`."""
    n, k = q.shape[-2:]
    nb, kb = scale_inv.shape[-2:]
    if n == nb * BLOCK and k == kb * BLOCK:
        # [..., N, K] -> [..., nb, 128, kb, 128]: the scale broadcasts without an [N, K] copy
        blocks = q.reshape(*q.shape[:-2], nb, BLOCK, kb, BLOCK).float()
        blocks = blocks * scale_inv.float()[..., :, None, :, None]
        return blocks.to(dtype).reshape(q.shape)
    full = scale_inv.float().repeat_interleave(BLOCK, -2).repeat_interleave(BLOCK, -1)
    return (q.float() * full[..., :n, :k]).to(dtype)


def fp8_linear(x: torch.Tensor, weight: Fp8Weight) -> torch.Tensor:
    """x @ dequantize(weight).T.

    Args:
        x: [T, K] (bf16 or fp32); weight: [N, K] e4m3 with its block scales.
    Returns:
        [T, N] in x's dtype.
    """
    return F.linear(x, dequantize(weight.weight, weight.scale_inv, x.dtype))
