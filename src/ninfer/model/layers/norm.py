"""Normalisations of Qwen3.5: zero-centred RMSNorm, gated RMSNorm, per-head L2 norm.

Imports only torch. All three compute in fp32 and cast back to the input dtype once, so bf16
activations lose precision only at the boundary, as the reference implementation does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm over the last dim: `x * rsqrt(mean(x²) + eps) * (1 + w)`.

    The checkpoint stores w - 1 (weights near 0), which keeps bf16 weights precise around 1.

    Args:
        x: [..., N] any float dtype.
        weight: [N].
    Returns:
        [..., N] in x's dtype.
    """
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * (1.0 + weight.float())).to(x.dtype)


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Plain RMSNorm (weight multiplies directly) then `* silu(gate)`: the DeltaNet output norm.

    Args:
        x: [..., N]; gate: same shape as x; weight: [N].
    Returns:
        [..., N] in x's dtype.
    """
    xf = x.float()
    out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (out * weight.float() * F.silu(gate.float())).to(x.dtype)


def l2_norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """`x / sqrt(sum(x²) + eps)` over the last dim, returned in fp32 (the delta rule's dtype)."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)
