"""Torch twin of the SwiGLU activation kernel.

Imports only torch. The same ops as the model's `swiglu` (model/layers/mlp.py), restated because
kernels/ may not import model/; a CPU test holds the two bit-identical.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[..., 2I] (gate then up) -> [..., I]: silu(gate) * up in gate_up's dtype."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
