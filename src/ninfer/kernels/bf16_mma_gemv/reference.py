"""Torch twin of the tensor-core bf16 skinny GEMM: `F.linear`, which is also what every CPU call
and every unrouted shape runs.

Imports only torch. The kernel multiplies bf16 operands on the tensor cores with fp32
accumulation and rounds each output to bf16 once; cuBLAS does the same up to its summation order
(the tensor core's internal adds are not IEEE round-to-nearest either), so the two agree to bf16
output rounding, not bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def bf16_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T.

    Args:
        x: [M, K]; weight: [N, K] (bf16 both, where the kernel runs).
    Returns:
        [M, N] in x's dtype.
    """
    return F.linear(x, weight)
