"""Sparse MoE feed-forward of Qwen3.5-MoE: softmax top-k router, fused experts, gated shared expert.

Imports torch, layers.mlp and kernels.dispatch. Experts stay fused ([E, 2I, H], [E, H, I]) so
kernels read them in place. `expert_path` names the four paths: small decode batches gather (a
GEMV per assignment, then one kernel for SwiGLU, down, weighted sum and shared expert; where the
shared expert has an expert's shape it runs inside those two kernels as one more assignment per
token, `shared_expert_in_kernels`, instead of three launches of its own), larger
decode batches group the assignments by expert on the device and read each expert once (two
grouped GEMVs), prefill sorts by expert for `torch._grouped_mm` (bf16, sm_90/100), else a loop
over experts (host counts: the only path that syncs, so decode and H200 prefill can be CUDA-graph
captured).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch
from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from ninfer.kernels.moe_routing.reference import route_topk
from ninfer.model.layers.mlp import MlpWeights, fused_mlp, mlp, swiglu

__all__ = [
    "GATHER_MAX_ASSIGNMENTS",
    "GROUP_GEMV_MAX_ASSIGNMENTS",
    "GROUP_GEMV_MIN_ASSIGNMENTS",
    "ExpertPath",
    "MoeWeights",
    "decode_path",
    "expert_path",
    "moe_experts",
    "route_topk",
    "shared_expert_in_kernels",
    "sparse_moe",
]


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
    # optional [E + 1 + pad, H]: router rows, the shared gate row, zero rows to a multiple of 8
    # (aligned output rows); one GEMV for both
    router_and_gate: torch.Tensor | None = None
    # optional [E + 1 + pad + 2 Is, H]: router_and_gate's rows then shared_gate_up's, both views
    # into it, for steps whose shared expert runs outside the expert kernels: the three GEMMs
    # that read x (router, shared gate, shared gate-up) as one
    router_gate_shared: torch.Tensor | None = None


class ExpertPath(enum.Enum):
    """How the routed experts run for one batch of assignments."""

    GATHERED = "gathered"  # per-assignment GEMVs reading experts in place by id (sync-free)
    GROUPED_GEMV = "grouped_gemv"  # one read per chosen expert for all its assignments (sync-free)
    GROUPED_MM = "grouped_mm"  # torch._grouped_mm over assignments sorted by expert (sync-free)
    LOOP = "loop"  # one matmul pair per expert that has tokens (host-side counts: syncs)


# Above this many (token, expert) assignments the gather path (the CUDA grouped GEMV, or its
# twin's [n, 2I, H] weight copies) costs more than a grouped GEMM (decode batches stay below it).
GATHER_MAX_ASSIGNMENTS = 256
# On CUDA, within these bounds the grouped GEMV (each chosen expert read once, CUDA cores) beats
# both the per-assignment gather (experts chosen twice are read twice) and torch._grouped_mm's
# tensor-core tiles (mostly padding at ~2 rows per expert). One 35B-A3B layer at top-8 (docs/
# perf.md, run R): 16 rows gather 189 µs / grouped GEMV 201; 32 rows 369 / 333; 64 rows 724 / 492
# (grouped GEMM 543); 128 rows grouped GEMM 613 / grouped GEMV 780.
GROUP_GEMV_MIN_ASSIGNMENTS = 129
GROUP_GEMV_MAX_ASSIGNMENTS = 768


def expert_path(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, num_assignments: int
) -> ExpertPath:
    """The path `moe_experts` takes for these operands (a host-side decision, no device sync)."""
    grouped = GROUP_GEMV_MIN_ASSIGNMENTS <= num_assignments <= GROUP_GEMV_MAX_ASSIGNMENTS
    if grouped and dispatch.expert_group_gemv_available(x, gate_up, down):
        return ExpertPath.GROUPED_GEMV
    if num_assignments <= GATHER_MAX_ASSIGNMENTS:
        return ExpertPath.GATHERED
    if _grouped_mm_fits(x, gate_up, down):
        return ExpertPath.GROUPED_MM
    return ExpertPath.LOOP


def decode_path(w: MoeWeights, dtype: torch.dtype, num_assignments: int) -> ExpertPath:
    """The path a step with `num_assignments` assignments takes over these experts, decided
    before any activation exists (CUDA-graph planning: LOOP cannot be captured)."""
    probe = torch.empty((1, w.experts_gate_up.shape[-1]), dtype=dtype, device=w.router.device)
    return expert_path(probe, w.experts_gate_up, w.experts_down, num_assignments)


def _grouped_mm_fits(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """bf16 everywhere (other dtypes take torch's host-synced fallback) and 16-byte row strides."""
    return (
        dispatch.grouped_mm_enabled(x)
        and x.dtype == gate_up.dtype == down.dtype == torch.bfloat16
        and gate_up.is_contiguous()
        and down.is_contiguous()
        and x.shape[-1] % 8 == 0
        and down.shape[-1] % 8 == 0
        and gate_up.data_ptr() % 16 == 0
        and down.data_ptr() % 16 == 0
    )


def shared_expert_in_kernels(w: MoeWeights) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(gate_up [2I, H], down [H, I]) of the shared expert where the gathered kernels can run it
    as one more assignment per token: plain tensors (not fp8), gate and up bound as one matrix,
    and the routed experts' shapes and dtype (Qwen3.5-MoE: intermediate 512 for both). Else None:
    the shared expert then runs as its own `mlp`."""
    gate_up, down = w.shared_gate_up, w.shared_down_proj
    if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
        return None
    experts_gate_up, experts_down = w.experts_gate_up, w.experts_down
    fits = (
        gate_up.shape == experts_gate_up.shape[1:]
        and down.shape == experts_down.shape[1:]
        and gate_up.dtype == experts_gate_up.dtype
        and down.dtype == experts_down.dtype
    )
    return (gate_up, down) if fits else None


def moe_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    shared: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,
    shared_expert: tuple[torch.Tensor, torch.Tensor] | None = None,
    path: ExpertPath | None = None,
) -> torch.Tensor:
    """Sum over each token's chosen experts of weight * expert_e(x) [+ sigmoid(gate) * shared].

    Args:
        x: [T, H]; gate_up: [E, 2I, H]; down: [E, H, I]; topk_weights: [T, k]; topk_ids: [T, k];
        shared: the shared expert's output [T, H], with shared_gate its gate logits [T, 1];
        shared_expert: instead of `shared`, the shared expert's (gate_up [2I, H], down [H, I])
        (`shared_expert_in_kernels`): the gathered path runs it inside its two kernels, the other
        paths compute its output first (as `mlp` does) and combine it as `shared`;
        path: force a path (tests); None picks `expert_path`.
    Returns:
        [T, H] in x's dtype.
    """
    if shared_expert is not None and shared is not None:
        raise ValueError("give the shared expert's output or its weights, not both")
    if path is None:
        path = expert_path(x, gate_up, down, topk_ids.numel())
    if path is ExpertPath.GATHERED:
        # On CUDA: one grouped GEMV reads the chosen experts (and the shared one) in place, one
        # kernel does the rest.
        shared_gate_up, shared_down = shared_expert if shared_expert is not None else (None, None)
        flat_ids = topk_ids.reshape(-1)  # assignment a is token a // k
        gate_up_out = dispatch.expert_gemv(
            x, gate_up, flat_ids, rows_per_input=topk_ids.shape[1], shared_weight=shared_gate_up
        )
        return dispatch.expert_down_sum(
            gate_up_out,
            down,
            topk_ids,
            topk_weights,
            shared=shared,
            shared_gate=shared_gate,
            shared_down=shared_down,
        )
    if shared_expert is not None:
        shared = fused_mlp(x, *shared_expert)
    if path is ExpertPath.GROUPED_GEMV:
        y = _experts_grouped_gemv(x, gate_up, down, topk_ids)  # [T * k, H]
        return dispatch.moe_combine(y, topk_weights, shared=shared, shared_gate=shared_gate)
    if path is ExpertPath.GROUPED_MM:
        y = _experts_grouped_mm(x, gate_up, down, topk_ids)
    else:
        y = _experts_loop(x, gate_up, down, topk_ids)
    # [T, k, H] weighted and summed over the k choices
    routed = (y * topk_weights.float()[..., None]).sum(1).to(x.dtype)
    if shared is None:
        return routed
    return routed + torch.sigmoid(shared_gate) * shared


def _experts_grouped_gemv(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """[T * k, H] expert outputs in x's dtype: two grouped GEMVs sharing one device-side sort by
    expert, rounded like the gathered path, so `moe_combine` after it equals `expert_down_sum`."""
    top_k = topk_ids.shape[1]
    flat_ids = topk_ids.reshape(-1)  # assignment a is token a // k
    groups = dispatch.expert_groups(flat_ids, gate_up.shape[0])
    gu = dispatch.expert_group_gemv(x, gate_up, flat_ids, rows_per_input=top_k, groups=groups)
    return dispatch.expert_group_gemv(
        gu, down, flat_ids, rows_per_input=1, swiglu_input=True, groups=groups
    )


def _experts_grouped_mm(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """[T, k, H] fp32 expert outputs: two grouped GEMMs over assignments sorted by expert.

    Group ends come from a device-side search over the sorted ids, never from host counts.
    """
    num_tokens, top_k = topk_ids.shape
    num_experts = gate_up.shape[0]
    sorted_ids, order = torch.sort(topk_ids.reshape(-1), stable=True)  # [T * k] each
    experts = torch.arange(num_experts, device=x.device, dtype=sorted_ids.dtype)
    # [E] int32: row end of expert e's group = number of sorted ids <= e
    ends = torch.searchsorted(sorted_ids, experts, right=True, out_int32=True)
    rows = x.index_select(0, order // top_k)  # [T * k, H], grouped by expert
    h = swiglu(torch._grouped_mm(rows, gate_up.transpose(-2, -1), offs=ends))  # [T * k, I]
    y_sorted = torch._grouped_mm(h, down.transpose(-2, -1), offs=ends)  # [T * k, H]
    y = torch.empty((order.numel(), down.shape[1]), dtype=torch.float32, device=x.device)
    y.index_copy_(0, order, y_sorted.float())  # back to assignment order
    return y.view(num_tokens, top_k, -1)


def _experts_loop(
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


def _gate_logits(
    x: torch.Tensor, w: MoeWeights, *, with_shared: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Router logits [T, E], the shared gate's logit [T, 1], and, when `with_shared` and the
    matrices allow, the shared expert's output [T, H] from the same GEMM (else None).

    With `router_gate_shared` bound the router, the shared gate and the shared expert's gate-up
    are one GEMM (three small latency-bound ones at 64 rows of the 35B-A3B: ~16 µs a layer);
    `router_shared_gemm` in NINFER_KERNELS_OFF keeps them apart (a device A/B)."""
    num_experts = w.router.shape[0]
    if w.router_and_gate is None:
        return F.linear(x, w.router), F.linear(x, w.shared_gate), None
    shared = None
    if (
        with_shared
        and w.router_gate_shared is not None
        and not dispatch.switched_off("router_shared_gemm")
    ):
        out = dispatch.linear(x, w.router_gate_shared)
        both = out[:, : w.router_and_gate.shape[0]]
        shared = dispatch.swiglu_linear(out[:, both.shape[1] :], w.shared_down_proj)
    else:
        both = dispatch.linear(x, w.router_and_gate)  # [T, E + 1 + zero padding]
    return both[:, :num_experts], both[:, num_experts : num_experts + 1], shared


def sparse_moe(x: torch.Tensor, w: MoeWeights, *, top_k: int, norm_topk_prob: bool) -> torch.Tensor:
    """Routed experts plus the shared expert scaled by sigmoid(shared_gate . x).

    On the gathered (decode) path the shared expert runs inside the expert kernels where it fits
    (`shared_expert_in_kernels`): at batch 1 its own GEMV, SwiGLU and GEMV were three
    latency-bound launches per layer. Both forms round alike (see expert_gemv/reference.py).

    Args:
        x: [T, H].
    Returns:
        [T, H].
    """
    path = expert_path(x, w.experts_gate_up, w.experts_down, x.shape[0] * top_k)
    # `shared_expert_in_kernels` in NINFER_KERNELS_OFF keeps the separate mlp (a device A/B)
    fuse = path is ExpertPath.GATHERED and not dispatch.switched_off("shared_expert_in_kernels")
    in_kernels = shared_expert_in_kernels(w) if fuse else None
    router_logits, gate_logits, shared = _gate_logits(x, w, with_shared=in_kernels is None)
    weights, ids = dispatch.route_topk(router_logits, top_k, normalize=norm_topk_prob)
    if in_kernels is None and shared is None:  # not from the router's GEMM
        shared = mlp(
            x,
            MlpWeights(w.shared_gate_proj, w.shared_up_proj, w.shared_down_proj, w.shared_gate_up),
        )
    return moe_experts(
        x,
        w.experts_gate_up,
        w.experts_down,
        weights,
        ids,
        shared=shared,
        shared_gate=gate_logits,
        shared_expert=in_kernels,
        path=path,
    )
