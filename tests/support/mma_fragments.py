"""PTX's mma.m16n8k16 (.bf16, fp32 accumulate) fragment layout written out in numpy, for the CPU
emulations of the tensor-core kernels (lane = 4 g + t):

    a0 = A[g][2t, 2t+1]   a1 = A[g+8][2t, 2t+1]   a2 = A[g][2t+8, 2t+9]   a3 = A[g+8][2t+8, 2t+9]
    b0 = B[2t, 2t+1][g]   b1 = B[2t+8, 2t+9][g]
    c0, c1 = C[g][2t, 2t+1]                       c2, c3 = C[g+8][2t, 2t+1]

Registers are uint32 words of two bf16, the lower column (or k) in the low half. The tiles are
rebuilt from the 32 lanes' registers and multiplied in float64, so a kernel's wrong register
order or k mapping shows up as a wrong product in the emulation that uses them.
"""

from __future__ import annotations

import numpy as np
import torch

LANES = np.arange(32)
G, T = LANES >> 2, LANES & 3
E = np.arange(2)


def bits(t: torch.Tensor) -> np.ndarray:
    """bf16 tensor -> uint16 bit patterns."""
    return t.contiguous().view(torch.int16).numpy().view(np.uint16)


def words(halves: np.ndarray) -> np.ndarray:
    """[..., 8] uint16 -> [..., 4] uint32 words, element 2i in the low half (little endian)."""
    h = halves.astype(np.uint32)
    return h[..., 0::2] | (h[..., 1::2] << np.uint32(16))


def word_values(w: np.ndarray) -> np.ndarray:
    """[...] uint32 bf16x2 words -> [..., 2] float64 (low half first)."""
    lo = ((w & np.uint32(0xFFFF)) << np.uint32(16)).view(np.float32)
    hi = (w & np.uint32(0xFFFF0000)).view(np.float32)
    return np.stack([lo, hi], axis=-1).astype(np.float64)


def ptx_tiles(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A [16, 16] and B [16, 8] from the lanes' registers a [32, 4] and b [32, 2]."""
    av, bv = word_values(a), word_values(b)  # [32, 4, 2], [32, 2, 2]
    tile_a, tile_b = np.full((16, 16), np.nan), np.full((16, 8), np.nan)
    rows, cols = G[:, None], 2 * T[:, None] + E
    tile_a[rows, cols] = av[:, 0]
    tile_a[rows + 8, cols] = av[:, 1]
    tile_a[rows, cols + 8] = av[:, 2]
    tile_a[rows + 8, cols + 8] = av[:, 3]
    tile_b[cols, rows] = bv[:, 0]
    tile_b[cols + 8, rows] = bv[:, 1]
    return tile_a, tile_b


def ptx_accumulator(d: np.ndarray) -> np.ndarray:
    """The [32, 4] accumulator registers (c0..c3 per lane) of the 16 x 8 result d."""
    return np.stack([d[G, 2 * T], d[G, 2 * T + 1], d[G + 8, 2 * T], d[G + 8, 2 * T + 1]], axis=1)
