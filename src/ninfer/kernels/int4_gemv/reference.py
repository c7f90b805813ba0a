"""Torch twin of the int4 GEMV: x against packed 4-bit rows with one fp32 scale per group of 64.

Imports only torch (kernels/ never imports model/, so the unpacking of
`model.lm_head_draft.quantize_int4`'s format is restated here). The format: packed uint8
[R, H / 2], element 2i in the low nibble of byte i and 2i + 1 in the high one, each stored as
q + 8 with q in -8..7; fp32 scales [R, H / group], symmetric (w ~ q * scale).
"""

from __future__ import annotations

import torch

GROUP = 64


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """[R, H / 2] uint8 -> q [R, H] int8 in -8..7."""
    low = (packed & 0xF).to(torch.int8) - 8
    high = (packed >> 4).to(torch.int8) - 8
    return torch.stack((low, high), dim=-1).reshape(packed.shape[0], -1)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """q * scale as fp32 [R, H] (each product rounded once to fp32)."""
    q = unpack_int4(packed).float()
    rows = q.shape[0]
    return (q.reshape(rows, -1, group) * scale.float()[..., None]).reshape(rows, -1)


def int4_linear(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, group: int = GROUP
) -> torch.Tensor:
    """out[m, r] = sum_g scale[r, g] * (sum_{h in group g} q[r, h] * float(x[m, h])).

    Rounding: x is converted to fp32 (exact for bf16 and fp32 x), each group's sum of q * x is
    computed in fp32 (q * x itself is exact for bf16 x), multiplied by the group's fp32 scale and
    the groups summed in fp32; the summation order is torch's, so a kernel agrees to fp32
    rounding, not bit for bit.

    Args:
        x: [M, H] (any float dtype; bf16 or fp32 in practice); packed: [R, H / 2] uint8;
        scale: [R, H / group] fp32.
    Returns:
        [M, R] float32.
    """
    rows, hidden = packed.shape[0], 2 * packed.shape[1]
    if x.dim() != 2 or x.shape[1] != hidden or hidden % group:
        raise ValueError(
            f"int4_linear: x {tuple(x.shape)} against packed {tuple(packed.shape)} "
            f"(H = {hidden}, group {group})"
        )
    groups = hidden // group
    q = unpack_int4(packed).float().reshape(rows, groups, group).transpose(0, 1)  # [G, R, g]
    xg = x.float().reshape(x.shape[0], groups, group).transpose(0, 1)  # [G, M, g]
    partial = torch.bmm(xg, q.transpose(1, 2))  # [G, M, R]: each group's q . x
    return (partial * scale.float().T[:, None, :]).sum(0)
