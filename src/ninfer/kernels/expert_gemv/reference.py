"""Torch twin of the grouped expert GEMV kernel.

Imports only torch. The same ops as the model's gathered-expert path (`_experts_gathered` in
model/layers/moe.py): gather each assignment's expert matrix, then one batched matmul; restated
because kernels/ may not import model/, and held bit-identical to it by a CPU test.
"""

from __future__ import annotations

import torch


def expert_gemv(
    x: torch.Tensor, weight: torch.Tensor, expert_ids: torch.Tensor, *, rows_per_input: int
) -> torch.Tensor:
    """out[a] = weight[expert_ids[a]] @ x[a // rows_per_input].

    Args:
        x: [A / rows_per_input, K]; weight: [E, N, K]; expert_ids: [A] int64.
    Returns:
        [A, N] in x's dtype.
    """
    if rows_per_input == 1:
        rows = x[..., None]  # [A, K, 1]
    else:
        rows = x[:, None, :].expand(-1, rows_per_input, -1).reshape(-1, x.shape[1], 1)
    return torch.bmm(weight[expert_ids], rows)[..., 0]
