"""SwiGLU feed-forward of the dense Qwen3.5 model (and of the MoE shared expert).

Imports torch and kernels.dispatch. Gate, up and down are separate checkpoint tensors; on a GPU
the model binds gate and up as one [2I, H] matrix (`gate_up`, the two fields then views into it)
so a step runs one GEMM and one fused activation kernel (at decode sizes the activation is
formed inside the down projection's GEMV, `dispatch.swiglu_linear`, or as the gate-up GEMV's
output, `dispatch.swiglu_mlp`). `swiglu` is split out because the fused MoE experts apply it to
a [.., 2I] gate-up row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch
from ninfer.kernels.fp8_gemv.reference import Fp8Weight


@dataclass(frozen=True)
class MlpWeights:
    gate_proj: torch.Tensor | Fp8Weight  # [I, H]
    up_proj: torch.Tensor | Fp8Weight  # [I, H]
    down_proj: torch.Tensor | Fp8Weight  # [H, I]
    gate_up: torch.Tensor | Fp8Weight | None = None  # optional [2I, H]: gate rows then up rows


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2I] (gate then up) -> [..., I]: silu(gate) * up."""
    return dispatch.silu_mul(gate_up)


def swiglu_mlp(
    x: torch.Tensor,
    gate_proj: torch.Tensor | Fp8Weight,
    up_proj: torch.Tensor | Fp8Weight,
    down_proj: torch.Tensor | Fp8Weight,
) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)).

    Args:
        x: [T, H]; gate_proj, up_proj: [I, H]; down_proj: [H, I].
    Returns:
        [T, H].
    """
    gate, up = dispatch.linear(x, gate_proj), dispatch.linear(x, up_proj)
    return dispatch.linear(F.silu(gate) * up, down_proj)


def fused_mlp(
    x: torch.Tensor, gate_up: torch.Tensor | Fp8Weight, down_proj: torch.Tensor | Fp8Weight
) -> torch.Tensor:
    """down(swiglu(gate_up(x))) with gate and up as one [2I, H] matrix: one gate-up GEMM.

    Args:
        x: [T, H]; gate_up: [2I, H], gate rows then up rows; down_proj: [H, I].
    Returns:
        [T, H].
    """
    return dispatch.swiglu_mlp(x, gate_up, down_proj)


def mlp(x: torch.Tensor, w: MlpWeights) -> torch.Tensor:
    """`swiglu_mlp` over bound weights: one gate-up GEMM when `w.gate_up` is bound.

    Args:
        x: [T, H].
    Returns:
        [T, H].
    """
    if w.gate_up is None:
        return swiglu_mlp(x, w.gate_proj, w.up_proj, w.down_proj)
    return fused_mlp(x, w.gate_up, w.down_proj)
