"""Torch twin of the gated RMSNorm kernel (the Gated DeltaNet output norm).

Imports only torch. Same maths as the model's `gated_rms_norm` (model/layers/norm.py), plus an
optional `out_dtype` so the model's following cast can be fused into the kernel; rounding from
fp32 to the output dtype happens once either way, so results are identical.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gated_rms_norm(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """`x * rsqrt(mean(x²) + eps) * w * silu(gate)` over the last dim.

    Args:
        x: [..., N]; gate: same shape (any float dtype); weight: [N].
        out_dtype: result dtype; None keeps x's dtype.
    Returns:
        [..., N].
    """
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float() * F.silu(gate.float())).to(out_dtype or x.dtype)
