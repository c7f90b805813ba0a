"""Sparse MoE feed-forward of Qwen3.5-MoE: softmax top-k router, fused experts, gated shared expert.

Imports torch, layers.mlp and kernels.dispatch. Experts are always fused ([E, 2I, H] gate-up,
[E, H, I] down), whatever the checkpoint had, so kernels read them in place. Two paths: few
assignments (decode) run one grouped GEMV per projection over the chosen experts (a CUDA kernel;
elsewhere its twin gathers each one's matrices into a batched matmul), with no host sync, so a
decode step can be CUDA-graph captured; many (prefill) group assignments by expert, which needs
the per-expert counts on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch
from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from ninfer.model.layers.mlp import MlpWeights, mlp, swiglu


@dataclass(frozen=True)
class MoeWeights:
    router: torch.Tensor  # [E, H]
    experts_gate_up: torch.Tensor  # [E, 2I, H], gate rows then up rows
    experts_down: torch.Tensor  # [E, H, I]
    shared_gate_proj: torch.Tensor | Fp8Weight  # [Is, H]
    shared_up_proj: torch.Tensor | Fp8Weight  # [Is, H]
    shared_down_proj: torch.Tensor | Fp8Weight  # [H, Is]
    shared_gate: torch.Tensor  # [1, H]
    # optional [2 Is, H]: gate and up as one matrix
    shared_gate_up: torch.Tensor | Fp8Weight | None = None


def route_topk(
    router_logits: torch.Tensor, top_k: int, *, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts (fp32), keep the top k, optionally renormalise them to sum to 1.

    Args:
        router_logits: [T, E].
    Returns:
        (weights [T, k] fp32, expert ids [T, k] int64).
    """
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids


# Above this many (token, expert) assignments the gather path (the CUDA grouped GEMV, or its
# twin's [n, 2I, H] weight copies) costs more than the grouped path's host sync (decode batches
# stay below it).
GATHER_MAX_ASSIGNMENTS = 256


def moe_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """Sum over each token's chosen experts of weight * expert_e(x).

    Args:
        x: [T, H]; gate_up: [E, 2I, H]; down: [E, H, I]; topk_weights: [T, k]; topk_ids: [T, k].
    Returns:
        [T, H] in x's dtype.
    """
    if topk_ids.numel() <= GATHER_MAX_ASSIGNMENTS:
        y = _experts_gathered(x, gate_up, down, topk_ids)
    else:
        y = _experts_grouped(x, gate_up, down, topk_ids)
    # [T, k, H] weighted and summed over the k choices
    return (y * topk_weights.float()[..., None]).sum(1).to(x.dtype)


def _experts_gathered(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """[T, k, H] fp32 expert outputs, each assignment with its own gathered weights (sync-free)."""
    num_tokens, top_k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1)  # assignment a is token a // k
    # On CUDA one grouped GEMV reads the chosen experts in place; the twin gathers them.
    h = swiglu(dispatch.expert_gemv(x, gate_up, flat_ids, rows_per_input=top_k))  # [T*k, I]
    y = dispatch.expert_gemv(h, down, flat_ids, rows_per_input=1)  # [T*k, H]
    return y.float().view(num_tokens, top_k, -1)


def _experts_grouped(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """[T, k, H] fp32 expert outputs, one matmul pair per expert that has tokens (host sync)."""
    num_tokens, top_k = topk_ids.shape
    flat_ids = topk_ids.reshape(-1)  # [T * k], assignment a belongs to token a // k
    order = torch.argsort(flat_ids, stable=True)
    counts = torch.bincount(flat_ids, minlength=gate_up.shape[0]).tolist()
    rows_sorted = x[order // top_k]  # [T * k, H], grouped by expert
    y_sorted = torch.empty(rows_sorted.shape, dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        span = slice(start, start + count)
        h = swiglu(F.linear(rows_sorted[span], gate_up[expert]))  # [n, I]
        y_sorted[span] = F.linear(h, down[expert]).float()
        start += count
    y = torch.empty_like(y_sorted)
    y[order] = y_sorted  # back to assignment order
    return y.view(num_tokens, top_k, -1)


def sparse_moe(x: torch.Tensor, w: MoeWeights, *, top_k: int, norm_topk_prob: bool) -> torch.Tensor:
    """Routed experts plus the shared expert scaled by sigmoid(shared_gate . x).

    Args:
        x: [T, H].
    Returns:
        [T, H].
    """
    weights, ids = route_topk(F.linear(x, w.router), top_k, normalize=norm_topk_prob)
    routed = moe_experts(x, w.experts_gate_up, w.experts_down, weights, ids)
    shared = mlp(
        x, MlpWeights(w.shared_gate_proj, w.shared_up_proj, w.shared_down_proj, w.shared_gate_up)
    )
    return routed + torch.sigmoid(F.linear(x, w.shared_gate)) * shared
