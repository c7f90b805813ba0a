"""Torch twins of the grouped expert GEMV and of the fused MoE decode tail.

Imports only torch. The same ops as the model's gathered-expert path (model/layers/moe.py): gather
each assignment's expert matrix, one batched matmul, SwiGLU as `silu_mul`'s twin, the weighted
sum over the k experts in fp32; restated because kernels/ may not import model/. The kernels
round where these ops round, so kernel and twin differ only by summation order.

The MoE shared expert can ride along as one more assignment per token (`shared_weight`,
`shared_down`): the twins then run it with the very ops of the model's separate shared expert
(`mlp`: F.linear, SwiGLU as `silu_mul`, F.linear) and combine it as a given shared output, so on
the CPU both forms give the same bits and the kernels have one rounding scheme to match.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def expert_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    expert_ids: torch.Tensor,
    *,
    rows_per_input: int,
    shared_weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[a] = weight[expert_ids[a]] @ x[a // rows_per_input], and optionally the shared expert.

    With `shared_weight` each input gets one more row after its routed ones (the shared expert's
    gate-up, for `expert_down_sum`'s `shared_down`): out[t (k + 1) + j] = weight[ids[t k + j]] @
    x[t] for j < k, out[t (k + 1) + k] = shared_weight @ x[t], k = rows_per_input; the ids keep
    their [T k] layout.

    Args:
        x: [A / rows_per_input, K]; weight: [E, N, K]; expert_ids: [A] int64;
        shared_weight: [N, K] (one expert's shape).
    Returns:
        [A, N] in x's dtype, or [A + A / rows_per_input, N] with `shared_weight`.
    """
    if rows_per_input == 1:
        rows = x[..., None]  # [A, K, 1]
    else:
        rows = x[:, None, :].expand(-1, rows_per_input, -1).reshape(-1, x.shape[1], 1)
    routed = torch.bmm(weight[expert_ids], rows)[..., 0]
    if shared_weight is None:
        return routed
    shared = F.linear(x, shared_weight)  # [T, N]: the separate shared expert's gate-up GEMM
    per_token = routed.view(x.shape[0], rows_per_input, -1)
    return torch.cat([per_token, shared[:, None]], dim=1).flatten(0, 1)


def expert_down_sum(
    gate_up_out: torch.Tensor,
    down: torch.Tensor,
    expert_ids: torch.Tensor,
    weights: torch.Tensor,
    *,
    shared: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,
    shared_down: torch.Tensor | None = None,
) -> torch.Tensor:
    """The MoE block after the gate-up GEMV: SwiGLU, down projection, weighted sum over the k.

    With `shared` (the shared expert's output) and `shared_gate` (its gate logit per token) it
    also adds sigmoid(shared_gate) * shared, so the decode step ends in one kernel. With
    `shared_down` instead of `shared`, each token's gate-up rows end with the shared expert's
    (`expert_gemv(..., shared_weight=)`), and the shared output is computed here from that row:
    SwiGLU, then shared_down, rounded to the dtype, and combined exactly as a given `shared` (it
    does not enter the fp32 routed sum).

    Args:
        gate_up_out: [T * k, 2I], gate then up per assignment (assignment t * k + j), or
        [T * (k + 1), 2I] with `shared_down`; down: [E, H, I]; expert_ids, weights: [T, k];
        shared: [T, H]; shared_gate: [T, 1]; shared_down: [H, I] (one expert's shape).
    Returns:
        [T, H] in gate_up_out's dtype.
    """
    num_tokens, top_k = expert_ids.shape
    if shared_down is not None:
        if shared is not None or shared_gate is None:
            raise ValueError("shared_down needs shared_gate and replaces shared")
        per_token = gate_up_out.view(num_tokens, top_k + 1, -1)
        gate, up = per_token[:, top_k].chunk(2, dim=-1)
        shared = F.linear(F.silu(gate) * up, shared_down)  # the separate shared expert's down
        gate_up_out = per_token[:, :top_k].reshape(num_tokens * top_k, -1)
    gate, up = gate_up_out.chunk(2, dim=-1)
    h = F.silu(gate) * up  # [T * k, I]
    y = expert_gemv(h, down, expert_ids.reshape(-1), rows_per_input=1)  # [T * k, H]
    return moe_combine(y, weights, shared=shared, shared_gate=shared_gate)


def moe_combine(
    y: torch.Tensor,
    weights: torch.Tensor,
    *,
    shared: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """sum_j weights[t, j] * y[t k + j] in fp32, then to y's dtype, plus sigmoid(gate) * shared.

    Args:
        y: [T * k, H] expert outputs in assignment order; weights: [T, k];
        shared: [T, H]; shared_gate: [T, 1].
    Returns:
        [T, H] in y's dtype.
    """
    num_tokens, top_k = weights.shape
    # [T, k, H] weighted and summed over the k choices
    routed = (y.float().view(num_tokens, top_k, -1) * weights.float()[..., None]).sum(1)
    routed = routed.to(y.dtype)
    if shared is None:
        return routed
    if shared_gate is None:
        raise ValueError("a shared expert output needs its gate logits (shared_gate)")
    return routed + torch.sigmoid(shared_gate) * shared


def expert_groups(expert_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Assignments sorted by expert, found on the device (no host sync, graph-capturable).

    Args:
        expert_ids: [A] (any integer dtype); num_experts: E.
    Returns:
        (order [A] int64: the assignments in expert order, ends [E] int32: the end of expert
        e's run in `order`).
    """
    flat = expert_ids.reshape(-1)
    sorted_ids, order = torch.sort(flat, stable=True)
    experts = torch.arange(num_experts, device=flat.device, dtype=sorted_ids.dtype)
    ends = torch.searchsorted(sorted_ids, experts, right=True, out_int32=True)
    return order, ends


def expert_group_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    expert_ids: torch.Tensor,
    *,
    rows_per_input: int,
    swiglu_input: bool = False,
    groups: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """`expert_gemv`'s products, optionally of SwiGLU'd inputs; the kernel reads each expert once.

    Args:
        x: [A / rows_per_input, K], or [A, 2K] gate then up with `swiglu_input`;
        weight: [E, N, K]; expert_ids: [A]; groups: `expert_groups(expert_ids, E)` when the
        caller already has it (the kernel's input; the twin does not need it).
    Returns:
        [A, N] in x's dtype, in assignment order.
    """
    del groups
    if swiglu_input:
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    return expert_gemv(x, weight, expert_ids.reshape(-1), rows_per_input=rows_per_input)
