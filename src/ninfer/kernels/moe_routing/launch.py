"""CUDA launchers of the MoE routing kernel (one warp per token row, four rows per block), of
`router_route` (the router's GEMV with the routing in its last block) and of `expert_sort`.

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


ROUTER_MAX_ROWS = 8  # router_route's x rows (one template instance per count)
ROUTER_WARPS = 8  # output rows per block (the .cu's RR_WARPS)
ROUTER_NORM_WIDTH = 2048  # norm_router_route's row width (the .cu's RR_NORM_VECS x 8)
# router_route's completion counters, one int32 per (device, router matrix): made outside graph
# capture (the capture's warm-up makes them), left at 0 by every launch's last block
_counters: dict[tuple[int, int], torch.Tensor] = {}


def supports_router_route(
    x: torch.Tensor, weight: torch.Tensor, num_experts: int, top_k: int
) -> bool:
    """Whether `router_route` takes x [M, K] against router rows [N, K] routing the first E
    logits: bf16, 1..ROUTER_MAX_ROWS dense 16-byte-aligned rows of x, a contiguous aligned
    weight with K a multiple of 8, E <= min(N, MAX_EXPERTS), 1 <= k <= min(E, MAX_TOP_K)."""
    if x.dim() != 2 or weight.dim() != 2 or x.dtype != torch.bfloat16:
        return False
    num_rows, k = x.shape
    n = weight.shape[0]
    return (
        weight.dtype == torch.bfloat16
        and weight.shape[1] == k
        and k % 8 == 0
        and 1 <= num_rows <= ROUTER_MAX_ROWS
        and 1 <= num_experts <= min(n, MAX_EXPERTS)
        and 1 <= top_k <= min(num_experts, MAX_TOP_K)
        and x.stride(1) == 1
        and (num_rows == 1 or x.stride(0) % 8 == 0)
        and x.data_ptr() % 16 == 0
        and weight.is_contiguous()
        and weight.data_ptr() % 16 == 0
        and x.device == weight.device
    )


def router_counter(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight`'s completion counter, made on first use; None while a CUDA graph is being
    captured and none exists yet (the caller then runs the two-launch path)."""
    key = (rt.device_index(weight.device), weight.data_ptr())
    counter = _counters.get(key)
    if counter is None and not torch.cuda.is_current_stream_capturing():
        counter = _counters[key] = torch.zeros(1, dtype=torch.int32, device=weight.device)
    return counter


def supports_norm_router_route(
    h: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    weight: torch.Tensor,
    num_experts: int,
    top_k: int,
) -> bool:
    """Whether `norm_router_route` takes these: `supports_router_route`'s rules for h, dense
    bf16 h and residual alike, a bf16 norm weight [K], and K = ROUTER_NORM_WIDTH (where
    add_rms_norm's one-pass plan is one vector a thread on 256 threads, as the kernel's)."""
    k = h.shape[-1]
    return (
        k == ROUTER_NORM_WIDTH
        and supports_router_route(h, weight, num_experts, top_k)
        and h.is_contiguous()
        and residual.shape == h.shape
        and residual.dtype == torch.bfloat16
        and residual.is_contiguous()
        and residual.data_ptr() % 16 == 0
        and norm_weight.shape == (k,)
        and norm_weight.dtype == torch.bfloat16
        and norm_weight.is_contiguous()
        and norm_weight.data_ptr() % 16 == 0
        and residual.device == norm_weight.device == h.device
    )


def router_route(
    x: torch.Tensor,
    weight: torch.Tensor,
    counter: torch.Tensor,
    num_experts: int,
    top_k: int,
    *,
    normalize: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits [M, N] bf16 = x @ weight.T, weights [M, k] fp32, ids [M, k] int64): the routing
    of each row's first E logits as `route_topk` routes those bf16 logits, in one launch."""
    device = rt.check_cuda(x, weight, counter)
    if not supports_router_route(x, weight, num_experts, top_k):
        raise rt.KernelInputError(
            f"router_route needs bf16 x of 1..{ROUTER_MAX_ROWS} dense aligned rows against "
            f"contiguous aligned bf16 router rows with K % 8 == 0, E <= min(N, {MAX_EXPERTS}) and "
            f"1 <= k <= min(E, {MAX_TOP_K}); got x {tuple(x.shape)} {x.dtype}, weight "
            f"{tuple(weight.shape)} {weight.dtype}, E = {num_experts}, k = {top_k}"
        )
    return _launch_router(x, weight, counter, num_experts, top_k, normalize, None, device)[2:]


def norm_router_route(
    h: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    counter: torch.Tensor,
    num_experts: int,
    top_k: int,
    *,
    normalize: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`router_route` of x = add_rms_norm(h, residual, norm_weight, eps)'s normed rows, formed in
    the same launch: (x, h + residual, logits, weights, ids), x and the sum with the bits
    add_rms_norm gives."""
    device = rt.check_cuda(h, residual, norm_weight, weight, counter)
    if not supports_norm_router_route(h, residual, norm_weight, weight, num_experts, top_k):
        raise rt.KernelInputError(
            f"norm_router_route needs router_route's operands with dense bf16 h and residual "
            f"[M, {ROUTER_NORM_WIDTH}] and a bf16 norm weight [{ROUTER_NORM_WIDTH}]; got h "
            f"{tuple(h.shape)} {h.dtype}, residual {tuple(residual.shape)} {residual.dtype}, "
            f"norm weight {tuple(norm_weight.shape)} {norm_weight.dtype}"
        )
    norm = (residual, norm_weight, eps)
    return _launch_router(h, weight, counter, num_experts, top_k, normalize, norm, device)


def _launch_router(
    x: torch.Tensor,
    weight: torch.Tensor,
    counter: torch.Tensor,
    num_experts: int,
    top_k: int,
    normalize: bool,
    norm: tuple[torch.Tensor, torch.Tensor, float] | None,
    device: torch.device,
) -> tuple[torch.Tensor, ...]:
    """One router_route launch: (normed, summed, logits, weights, ids), the first two None
    without `norm` (x is then the GEMV's input; with it, h, whose normed rows are)."""
    num_rows, k = x.shape
    n = weight.shape[0]
    logits = torch.empty((num_rows, n), dtype=torch.bfloat16, device=device)
    weights = torch.empty((num_rows, top_k), dtype=torch.float32, device=device)
    ids = torch.empty((num_rows, top_k), dtype=torch.int64, device=device)
    normed = summed = None
    if norm is not None:
        normed, summed = torch.empty_like(x), torch.empty_like(x)
    keys = "true" if chooses_by_keys(x) else "false"
    has_norm = "true" if norm is not None else "false"
    instance = f"router_route<{num_rows}, {values_per_lane(num_experts)}, {keys}, {has_norm}>"
    kernel = rt.get_kernel(OP, instance, device)
    residual, norm_weight, eps = norm if norm is not None else (None, None, 0.0)
    args = (
        rt.ptr(logits),
        rt.ptr(weights),
        rt.ptr(ids),
        rt.ptr(counter),
        rt.ptr(x),  # with the norm: h, the rows it is formed from
        rt.i64(x.stride(0)),
        rt.ptr(weight),
        rt.i32(n),
        rt.i32(k),
        rt.i32(num_experts),
        rt.i32(top_k),
        rt.i32(int(normalize)),
        rt.ptr(residual),
        rt.ptr(norm_weight),
        rt.ptr(normed),
        rt.ptr(summed),
        rt.f32(eps),
    )
    rt.launch(kernel, (-(-n // ROUTER_WARPS),), (32 * ROUTER_WARPS,), args, device)
    return normed, summed, logits, weights, ids


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
    args = (rt.ptr(order), rt.ptr(ends), rt.ptr(flat), rt.i32(count), rt.i32(num_experts))
    kernel = rt.get_kernel(OP, "expert_sort", device)
    rt.launch(kernel, (1,), (threads,), args, device, shared_mem=4 * (count + num_experts))
    return order, ends
