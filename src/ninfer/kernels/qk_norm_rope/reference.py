"""Torch twins of the fused q/k RMSNorm + RoPE kernel and of its form with the KV store.

Imports only torch. Restates, op for op, the model's `apply_rope(rms_norm(x, w, eps), cos, sin)`
for q and for k (model/layers/norm.py and rope.py), because kernels/ may not import model/; a CPU
test holds the two bit-identical.
"""

from __future__ import annotations

import torch


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).to(x.dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rotary_dim = cos.shape[-1]
    half = rotary_dim // 2
    x_rot = x[..., :rotary_dim].float()
    x1, x2 = x_rot[..., :half], x_rot[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    out = x_rot * cos[:, None, :] + rotated * sin[:, None, :]
    return torch.cat((out.to(x.dtype), x[..., rotary_dim:]), dim=-1)


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rope(rms_norm(q)), rope(rms_norm(k))).

    Args:
        q: [T, Hq, D]; k: [T, Hk, D] (views are fine); q_weight, k_weight: [D];
        cos, sin: [T, R] fp32, R <= D even.
    Returns:
        q, k: [T, H, D] contiguous, in their input dtype.
    """
    return (
        _rope(_rms_norm(q, q_weight, eps), cos, sin),
        _rope(_rms_norm(k, k_weight, eps), cos, sin),
    )


def qk_norm_rope_store(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`qk_norm_rope`, then k's result and v written to their flat page slots (page * P +
    offset) of plain pages [pages, P, Hk, D], as the model's separate store does (index_copy).
    Returns (q, k) as `qk_norm_rope`."""
    q_out, k_out = qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps)
    for pages, rows in ((k_pages, k_out), (v_pages, v)):
        flat = pages.view(-1, pages.shape[2], pages.shape[3])
        flat.index_copy_(0, slot_mapping, rows.to(pages.dtype))
    return q_out, k_out
