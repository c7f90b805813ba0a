"""Torch twin of the fused residual add + zero-centred RMSNorm kernel.

Imports only torch. The maths is the model's `rms_norm` (model/layers/norm.py) applied to the
rounded sum, written out here because kernels/ may not import model/; a CPU test holds the two
equal. The sum is rounded to the input dtype first, as the unfused `x = x + h` does.
"""

from __future__ import annotations

import torch


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`summed = x + residual`; `normed = summed * rsqrt(mean(summed²) + eps) * (1 + w)`.

    Args:
        x: [..., N] float32 or bfloat16; residual: same shape and dtype, or None (plain norm).
        weight: [N].
    Returns:
        (normed, summed), both [..., N] in x's dtype; summed is x itself when residual is None.
    """
    summed = x if residual is None else x + residual
    sf = summed.float()
    normed = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * (1.0 + weight.float())).to(x.dtype), summed
