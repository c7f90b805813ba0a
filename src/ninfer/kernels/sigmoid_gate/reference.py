"""Torch twin of the sigmoid-gate kernel: the gated attention's eager output gate.

Imports only torch. What every CPU call and every operand the kernel does not take runs.
"""

from __future__ import annotations

import torch


def sigmoid_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """[T, H, D] attention output and gate -> [T, H * D]: o * sigmoid(gate) in o's dtype."""
    return (o * torch.sigmoid(gate)).reshape(o.shape[0], -1)
