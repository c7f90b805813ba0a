"""CUDA launcher of the MoE routing kernel (one warp per token row, four rows per block).

Imports torch and kernels.runtime. Same signature and results as `reference.route_topk` where
`supports` says yes (2-D logits with dense rows, at most 1024 experts, k at most 32 and E);
dispatch runs the twin otherwise. Output sizes depend only on shapes, so a CUDA graph captures it.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.switches import switched_off

OP = "moe_routing"
ROWS_PER_BLOCK = 4  # one warp per row
MAX_EXPERTS = 1024  # 32 lanes x 32 logits in registers
MAX_TOP_K = 32  # lane r keeps the r-th choice
SORT_MAX_ASSIGNMENTS = 2048  # expert_sort's O(A^2 / 1024) rank count stays a few µs below this
SORT_THREADS = 1024
# Whether dispatch.expert_groups runs `expert_sort` (measured, H200, docs/perf.md run V1: 7.0 µs
# against torch's sort + searchsorted 33.7 µs at 512 assignments, 4.0 against 16.4 at 128; equal
# results); direct calls take it regardless.
SORT_ROUTED = True


# expert_sort ranks through a per-chunk count table (O(A / 32) steps per expert) where the table
# and the ids fit this much shared memory (the 35B's 512 assignments x 256 experts: 19 KiB), else
# by the O(A^2 / blockDim) count. The same order and ends either way (GPU test, run S39B). On by
# default since S39B (with the loads-first combine: the 35B-A3B 64-row step 0.997x on an H100);
# `NINFER_KERNELS_OFF=sort_table` keeps the count.
SORT_TABLE = "sort_table"
SORT_TABLE_SMEM = 48 * 1024


def values_per_lane(num_experts: int) -> int:
    """Logits each lane holds: the smallest power of two covering E / 32 (one instance each)."""
    vals = 1
    while 32 * vals < num_experts:
        vals *= 2
    return vals


def supports(router_logits: torch.Tensor, top_k: int) -> bool:
    """Whether the kernel takes these operands (otherwise the twin runs)."""
    if router_logits.dtype not in rt.CUDA_TYPES or router_logits.dim() != 2:
        return False
    num_experts = router_logits.shape[1]
    return (
        1 <= num_experts <= MAX_EXPERTS
        and 1 <= top_k <= min(num_experts, MAX_TOP_K)
        and router_logits.stride(1) == 1
    )


def chooses_by_keys(router_logits: torch.Tensor) -> bool:
    """Whether the kernel chooses by packed (logit, id) keys and one warp max a round: bf16 logits
    (their 16 bits fit the key) unless `routing_keys` is in NINFER_KERNELS_OFF, which keeps the
    (logit, id) butterfly that fp32 logits always take. Same choices and weights either way."""
    return router_logits.dtype == torch.bfloat16 and not switched_off("routing_keys")


def route_topk(
    router_logits: torch.Tensor, top_k: int, *, normalize: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """See `reference.route_topk`."""
    device = rt.check_cuda(router_logits)
    if not supports(router_logits, top_k):
        raise rt.KernelInputError(
            f"MoE routing needs [T, E] fp32/bf16 logits with dense rows, E <= {MAX_EXPERTS} and "
            f"1 <= k <= min(E, {MAX_TOP_K}); got {tuple(router_logits.shape)} "
            f"{router_logits.dtype} with stride {router_logits.stride()}, k = {top_k}"
        )
    num_rows, num_experts = router_logits.shape
    weights = torch.empty((num_rows, top_k), dtype=torch.float32, device=device)
    ids = torch.empty((num_rows, top_k), dtype=torch.int64, device=device)
    if num_rows == 0:
        return weights, ids
    vals = values_per_lane(num_experts)
    keys = "true" if chooses_by_keys(router_logits) else "false"
    kernel = rt.get_kernel(
        OP, f"moe_routing<{rt.cuda_type(router_logits, 'router_logits')}, {vals}, {keys}>", device
    )
    args = (
        rt.ptr(weights),
        rt.ptr(ids),
        rt.ptr(router_logits),
        rt.i64(router_logits.stride(0)),
        rt.i32(num_rows),
        rt.i32(num_experts),
        rt.i32(top_k),
        rt.i32(int(normalize)),
    )
    grid = (-(-num_rows // ROWS_PER_BLOCK),)
    rt.launch(kernel, grid, (32 * ROWS_PER_BLOCK,), args, device)
    return weights, ids


def supports_sort(expert_ids: torch.Tensor, num_experts: int) -> bool:
    """Whether `expert_sort` takes these ids: int64 on CUDA, 1..SORT_MAX_ASSIGNMENTS of them,
    1..MAX_EXPERTS experts."""
    return (
        expert_ids.is_cuda
        and expert_ids.dtype == torch.int64
        and 1 <= expert_ids.numel() <= SORT_MAX_ASSIGNMENTS
        and 1 <= num_experts <= MAX_EXPERTS
    )


def expert_sort(expert_ids: torch.Tensor, num_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """See `expert_gemv.reference.expert_groups`: (order [A] int64, ends [E] int32), the order
    within each expert's run the assignment order (a stable sort), in one launch."""
    device = rt.check_cuda(expert_ids)
    if not supports_sort(expert_ids, num_experts):
        raise rt.KernelInputError(
            f"expert sort needs 1..{SORT_MAX_ASSIGNMENTS} int64 ids on CUDA and 1..{MAX_EXPERTS} "
            f"experts; got {expert_ids.numel()} {expert_ids.dtype} ids, {num_experts} experts"
        )
    flat = expert_ids.reshape(-1).contiguous()
    count = flat.numel()
    order = torch.empty(count, dtype=torch.int64, device=device)
    ends = torch.empty(num_experts, dtype=torch.int32, device=device)
    threads = min(SORT_THREADS, -(-max(count, num_experts) // 32) * 32)
    shared = 4 * (count + num_experts)
    table = sort_table_bytes(count, num_experts)
    use_table = shared + table <= SORT_TABLE_SMEM and not switched_off(SORT_TABLE)
    if use_table:
        shared += table
    args = (
        rt.ptr(order),
        rt.ptr(ends),
        rt.ptr(flat),
        rt.i32(count),
        rt.i32(num_experts),
        rt.i32(int(use_table)),
    )
    kernel = rt.get_kernel(OP, "expert_sort", device)
    rt.launch(kernel, (1,), (threads,), args, device, shared_mem=shared)
    return order, ends


def sort_table_bytes(count: int, num_experts: int) -> int:
    """Shared memory of expert_sort's per-chunk count table: [ceil(A / 32)][E] ints."""
    return 4 * -(-count // 32) * num_experts
