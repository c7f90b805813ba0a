"""Torch twin of the MoE routing kernel: fp32 softmax over experts, top-k, optional renormalising.

Imports only torch. The choice is made on the fp32 logits (softmax is monotonic, so it is the
same choice as on the probabilities) with a stable descending sort, so equal logits -- common in
bf16 -- go to the lower expert id. `torch.topk` promises no order among ties, and the CUDA kernel
must pick exactly the experts this twin picks.
"""

from __future__ import annotations

import torch


def route_topk(
    router_logits: torch.Tensor, top_k: int, *, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts (fp32), keep the top k, optionally renormalise them to sum to 1.

    Ties in the logits go to the lower expert id; choices come in descending order.

    Args:
        router_logits: [T, E] (any row stride).
    Returns:
        (weights [T, k] fp32, expert ids [T, k] int64), both contiguous.
    """
    logits = router_logits.float()
    probs = torch.softmax(logits, dim=-1)
    ids = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :top_k].contiguous()
    weights = probs.gather(-1, ids)
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids
