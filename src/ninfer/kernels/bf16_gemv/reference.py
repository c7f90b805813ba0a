"""Torch twin of the bf16 GEMV: `F.linear`, which is also what every CPU call runs.

Imports only torch. The kernel computes the same products in fp32 and rounds each output to bf16
once; cuBLAS does the same up to its summation order (and split-K choices), so the two agree to
bf16 output rounding, not bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.kernels.silu_mul.reference import silu_mul


def bf16_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T.

    Args:
        x: [M, K]; weight: [N, K] (bf16 both, where the kernel runs).
    Returns:
        [M, N] in x's dtype.
    """
    return F.linear(x, weight)


def swiglu_linear(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """swiglu(gate_up) @ weight.T: the kernel's SwiGLU-input form, silu_mul then the product.

    Args:
        gate_up: [M, 2K], gate columns then up columns; weight: [N, K].
    Returns:
        [M, N] in gate_up's dtype.
    """
    return F.linear(silu_mul(gate_up), weight)


def sigmoid_gate_linear(o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(o * sigmoid(gate)) @ weight.T: the gated attention's output gate, then o_proj.

    Args:
        o: [M, H, D]; gate: [M, H, D] (any strides); weight: [N, H * D].
    Returns:
        [M, N] in o's dtype.
    """
    return F.linear((o * torch.sigmoid(gate)).reshape(o.shape[0], -1), weight)
