"""SwiGLU feed-forward of the dense Qwen3.5 model (and of the MoE shared expert).

Imports only torch. Gate, up and down stay separate checkpoint tensors so binding them is
zero-copy; `swiglu` is split out because the fused MoE experts apply it to a [.., 2I] gate-up row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class MlpWeights:
    gate_proj: torch.Tensor  # [I, H]
    up_proj: torch.Tensor  # [I, H]
    down_proj: torch.Tensor  # [H, I]


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2I] (gate then up) -> [..., I]: silu(gate) * up."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_mlp(
    x: torch.Tensor, gate_proj: torch.Tensor, up_proj: torch.Tensor, down_proj: torch.Tensor
) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)).

    Args:
        x: [T, H]; gate_proj, up_proj: [I, H]; down_proj: [H, I].
    Returns:
        [T, H].
    """
    return F.linear(F.silu(F.linear(x, gate_proj)) * F.linear(x, up_proj), down_proj)
