"""CUDA launchers of the grouped expert GEMV and of the fused MoE decode tail (`expert_down_sum`).

Imports torch and kernels.runtime. Same signatures and results as the `reference` twins where
the `supports*` checks say yes (contiguous aligned [E, N, K] weights, K a multiple of one 16-byte
load, rows 16-byte aligned); dispatch runs the twin otherwise. Short rows (K <= 1024, the 35B
down projection's 512) get 8 rows per warp so each lane keeps 8 loads in flight; `expert_gemv`
also unrolls its chunk loop (`GEMV_UNROLL`) so longer rows keep as many in flight. With the MoE
shared expert's matrices given (`shared_weight`, `shared_down`) the two kernels run it as one more
assignment per token, so a decode step's shared expert costs no launches of its own. The grouped
GEMV runs on tensor cores (`expert_group_mma`) for bf16 models on sm_80+ where `uses_group_mma`
says so, else (fp32 models, `tensor_cores=False`) on CUDA cores (`expert_group_gemv`).
"""

from __future__ import annotations

import functools

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.expert_gemv.reference import expert_groups
from ninfer.kernels.switches import switched_off, switched_on

OP = "expert_gemv"
THREADS = 256
WARPS = THREADS // 32
MAX_K = 12288  # x staged as fp32 in the 48 KiB of static-launch shared memory
SHORT_ROW = 1024  # up to this K a warp owns 8 rows, above it 4
# Chunk steps per lane per loop iteration of expert_gemv: ROWS x GEMV_UNROLL independent 16-byte
# loads in flight per lane (1 is the schedule of the kernel before the unroll; the two give
# bit-identical results, and kernel_bench --moe-batches times both).
GEMV_UNROLL = 2
GEMV_UNROLLS = (1, 2)  # the instances the launcher may request
DOWN_ROWS = 8  # rows per warp of expert_down_sum (its instance's template argument)
MAX_TOP_K = 32  # expert_down_sum's shared partials hold at most 32 units of DOWN_ROWS rows
DOWN_MAX_WARPS = 16  # expert_down_sum's __launch_bounds__(512): one warp per unit up to 16
MAX_TOKENS = 65535  # grid.y of expert_down_sum


def rows_per_warp(k: int) -> int:
    """Output rows per warp of `expert_gemv` (independent 16-byte loads in flight per lane)."""
    return 8 if k <= SHORT_ROW else 4


def _aligned_experts(weight: torch.Tensor, dtype: torch.dtype) -> bool:
    """[E, N, K] contiguous, 16-byte aligned, K a whole number of 16-byte loads."""
    return (
        weight.dtype == dtype
        and dtype in rt.CUDA_TYPES
        and weight.dim() == 3
        and weight.is_contiguous()
        and weight.shape[2] % (16 // weight.element_size()) == 0
        and weight.data_ptr() % 16 == 0
    )


def _shared_matrix_fits(matrix: torch.Tensor | None, experts: torch.Tensor) -> bool:
    """No shared-expert matrix, or one shaped like one expert's ([N, K] of [E, N, K]) that the
    kernels read as they read an expert: same dtype, contiguous, 16-byte aligned."""
    return matrix is None or (
        matrix.dtype == experts.dtype
        and experts.dim() == 3
        and matrix.shape == experts.shape[1:]
        and matrix.is_contiguous()
        and matrix.data_ptr() % 16 == 0
    )


def supports(
    x: torch.Tensor, weight: torch.Tensor, shared_weight: torch.Tensor | None = None
) -> bool:
    """Whether the expert GEMV kernel takes these operands (otherwise the twin runs)."""
    return (
        _aligned_experts(weight, x.dtype)
        and weight.shape[2] <= MAX_K
        and x.dim() == 2
        and x.shape[-1] == weight.shape[2]
        and x.stride(-1) == 1
        and x.data_ptr() % 16 == 0
        and (x.stride(0) * x.element_size() % 16 == 0 or x.shape[0] <= 1)
        and _shared_matrix_fits(shared_weight, weight)
    )


def supports_down_sum(
    gate_up_out: torch.Tensor,
    down: torch.Tensor,
    expert_ids: torch.Tensor,
    shared: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,
    shared_down: torch.Tensor | None = None,
) -> bool:
    """Whether the fused decode-tail kernel takes these operands (otherwise the twin runs)."""
    dtype = gate_up_out.dtype
    if not _aligned_experts(down, dtype) or gate_up_out.dim() != 2 or expert_ids.dim() != 2:
        return False
    num_tokens, top_k = expert_ids.shape
    _, n, k = down.shape
    slots = top_k + (shared_down is not None)  # gate-up rows per token
    row_bytes = gate_up_out.stride(0) * gate_up_out.element_size()
    ok = (
        top_k >= 1
        and slots <= MAX_TOP_K
        and num_tokens <= MAX_TOKENS
        and gate_up_out.shape == (num_tokens * slots, 2 * k)
        and gate_up_out.stride(1) == 1
        and (row_bytes % 16 == 0 or num_tokens * slots <= 1)
        and gate_up_out.data_ptr() % 16 == 0
    )
    if not ok:
        return False
    if shared_down is None:
        return _shared_fits(shared, shared_gate, dtype, num_tokens, n)
    return (
        shared is None
        and _shared_matrix_fits(shared_down, down)
        and _gate_fits(shared_gate, dtype, num_tokens)
    )


def _gate_fits(shared_gate: torch.Tensor | None, dtype: torch.dtype, num_tokens: int) -> bool:
    """The shared expert's gate logits [T, 1] (any row stride)."""
    return (
        shared_gate is not None
        and shared_gate.dtype == dtype
        and shared_gate.shape == (num_tokens, 1)
    )


def _shared_fits(
    shared: torch.Tensor | None,
    shared_gate: torch.Tensor | None,
    dtype: torch.dtype,
    num_tokens: int,
    n: int,
) -> bool:
    """Neither, or a shared expert output [T, N] with dense rows and its gate logits [T, 1]."""
    if shared is None:
        return shared_gate is None
    return (
        _gate_fits(shared_gate, dtype, num_tokens)
        and shared.dtype == dtype
        and shared.shape == (num_tokens, n)
        and shared.stride(1) == 1
    )


def expert_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    expert_ids: torch.Tensor,
    *,
    rows_per_input: int,
    shared_weight: torch.Tensor | None = None,
    unroll: int | None = None,
) -> torch.Tensor:
    """See `reference.expert_gemv`; `unroll` overrides `GEMV_UNROLL` (kernel_bench compares)."""
    device = rt.check_cuda(x, weight, expert_ids, shared_weight)
    if not supports(x, weight, shared_weight):
        raise rt.KernelInputError(
            f"expert GEMV needs contiguous aligned [E, N, K] weights with K % 8 == 0 and "
            f"K <= {MAX_K}, x rows dense, 16-byte aligned and of the same dtype, and a shared "
            f"matrix (if any) shaped like one expert; got x {tuple(x.shape)} {x.dtype}, weight "
            f"{tuple(weight.shape)} {weight.dtype}, shared "
            f"{None if shared_weight is None else tuple(shared_weight.shape)}"
        )
    unroll = GEMV_UNROLL if unroll is None else unroll
    if unroll not in GEMV_UNROLLS:
        raise rt.KernelInputError(f"unroll {unroll} is not one of {GEMV_UNROLLS}")
    if expert_ids.numel() != x.shape[0] * rows_per_input:
        raise rt.KernelInputError(
            f"{expert_ids.numel()} expert ids for {x.shape[0]} inputs x {rows_per_input} rows each"
        )
    _, n, k = weight.shape
    ids = expert_ids.reshape(-1).to(torch.int64).contiguous()
    num_assignments = x.shape[0] * (rows_per_input + (shared_weight is not None))
    out = torch.empty((num_assignments, n), dtype=x.dtype, device=device)
    if num_assignments == 0:
        return out
    rows = rows_per_warp(k)
    instance = f"expert_gemv<{rt.cuda_type(x, 'x')}, {rows}, {unroll}>"
    kernel = rt.get_kernel(OP, instance, device)
    args = (
        rt.ptr(out),
        rt.ptr(x),
        rt.i64(x.stride(0)),
        rt.ptr(weight),
        rt.ptr(ids),
        rt.ptr(shared_weight),
        rt.i32(rows_per_input),
        rt.i32(n),
        rt.i32(k),
    )
    grid = (-(-n // (WARPS * rows)), num_assignments)
    rt.launch(kernel, grid, (THREADS,), args, device, shared_mem=4 * k)
    return out


def down_sum_block(top_k: int, with_shared_down: bool) -> tuple[int, int]:
    """(row groups per block, threads per block) of expert_down_sum.

    Row groups: enough that small k still gives the 8 warps a unit each. Threads: 8 warps, or one
    warp per unit where there are more units (k = 8 plus the shared slot: 9) up to
    DOWN_MAX_WARPS, so that no warp of the block runs two units while the others wait.
    """
    slots = top_k + with_shared_down
    groups = max(1, WARPS // slots)
    warps = max(WARPS, min(slots * groups, DOWN_MAX_WARPS))
    return groups, 32 * warps


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
    """See `reference.expert_down_sum`."""
    device = rt.check_cuda(gate_up_out, down, expert_ids, weights, shared, shared_gate, shared_down)
    if not supports_down_sum(gate_up_out, down, expert_ids, shared, shared_gate, shared_down):
        raise rt.KernelInputError(
            f"fused MoE down projection needs aligned [E, H, I] experts (I % 8 == 0), gate-up "
            f"rows [T * s, 2I] (s = k, or k + 1 with shared_down) with 16-byte aligned dense "
            f"rows, s <= {MAX_TOP_K}, T <= {MAX_TOKENS}, and gate logits [T, 1] with either a "
            f"shared output [T, H] or shared_down [H, I] (or none of the three); got gate_up "
            f"{tuple(gate_up_out.shape)} {gate_up_out.dtype}, down {tuple(down.shape)} "
            f"{down.dtype}, ids {tuple(expert_ids.shape)}"
        )
    num_tokens, top_k = expert_ids.shape
    _, n, k = down.shape
    out = torch.empty((num_tokens, n), dtype=gate_up_out.dtype, device=device)
    if num_tokens == 0:
        return out
    ids = expert_ids.reshape(-1).to(torch.int64).contiguous()
    route_w = weights.reshape(-1).to(torch.float32).contiguous()
    if route_w.numel() != ids.numel():
        raise rt.KernelInputError(f"{route_w.numel()} routing weights for {ids.numel()} experts")
    groups, threads = down_sum_block(top_k, shared_down is not None)
    kernel = rt.get_kernel(
        OP, f"expert_down_sum<{rt.cuda_type(gate_up_out, 'gate_up_out')}, {DOWN_ROWS}>", device
    )
    args = (
        rt.ptr(out),
        rt.ptr(gate_up_out),
        rt.i64(gate_up_out.stride(0)),
        rt.ptr(down),
        rt.ptr(ids),
        rt.ptr(route_w),
        rt.ptr(shared),
        rt.i64(0 if shared is None else shared.stride(0)),
        rt.ptr(shared_gate),
        rt.i64(0 if shared_gate is None else shared_gate.stride(0)),
        rt.ptr(shared_down),
        rt.i32(top_k),
        rt.i32(groups),
        rt.i32(n),
        rt.i32(k),
    )
    grid = (-(-n // (DOWN_ROWS * groups)), num_tokens)
    rt.launch(kernel, grid, (threads,), args, device)
    return out


GROUP_MAX_INPUTS = 4  # staged inputs per pass of expert_group_gemv (MAXM)
GROUP_SMEM = 48 * 1024  # static-launch shared memory: MAXM staged rows of K


def supports_group(x: torch.Tensor, weight: torch.Tensor, *, swiglu_input: bool = False) -> bool:
    """Whether expert_group_gemv takes these operands (otherwise the twin runs)."""
    if not _aligned_experts(weight, x.dtype) or x.dim() != 2 or x.stride(-1) != 1:
        return False
    k = weight.shape[2]
    width = 2 * k if swiglu_input else k
    return (
        x.shape[-1] == width
        and GROUP_MAX_INPUTS * k * x.element_size() <= GROUP_SMEM
        and (x.stride(0) * x.element_size() % 16 == 0 or x.shape[0] <= 1)
        and x.data_ptr() % 16 == 0
    )


# expert_group_mma (the tensor-core grouped GEMV, bf16 only): 8 warps x 16 weight rows per block,
# each pass takes up to 8 inputs per n-tile, staged bf16 rows of K + GROUP_MMA_PAD.
GROUP_MMA_ROWS = 16 * WARPS
GROUP_MMA_PAD = 32  # egmma::kPad: staged rows 64 bytes apart mod 128 (no shared bank conflicts)
# The register ring's depth: 32-wide k steps in flight per lane (the kernel's D; 2 D 16-byte
# loads). 4: <= 128 registers, 2 blocks per SM; 2: <= 80 registers, 3 blocks per SM (nvcc sm_90,
# no spills). The CP form below replaced it in dispatch; kernel_bench --moe-batches times both
# depths beside it.
GROUP_MMA_DEPTH = 4
GROUP_MMA_DEPTHS = (2, 4)  # the register-ring instances the launcher may request
# The mma kernel's CP form (its ring of D + 1 steps in shared memory, filled by cp.async):
# GROUP_MMA_CP_DEPTH steps in flight a lane without registers. Dispatch's default since run S42A
# (H100, 35B-A3B at 64 rows, 2k): the step 0.917x the register ring's (26.72 against 29.16 ms),
# where alone the two are even (gate-up ~307 µs): inside the step the loads wait longer than in a
# sweep, and only more bytes in flight hide that (the register ring at depth 2 took 1.125x). The
# same bits. `NINFER_KERNELS_OFF=group_mma_cp` runs the register ring at GROUP_MMA_DEPTH.
GROUP_MMA_CP_SWITCH = "group_mma_cp"
GROUP_MMA_CP_DEPTH = 7


def uses_cp_ring() -> bool:
    """Whether dispatch's grouped mma runs the CP form (unless `group_mma_cp` is switched off)."""
    return not switched_off(GROUP_MMA_CP_SWITCH)


def group_mma_cp_ring(depth: int = GROUP_MMA_CP_DEPTH) -> int:
    """Bytes of the CP form's weight ring: D + 1 steps of 16 bytes of each of a lane's two rows."""
    return (depth + 1) * 2 * THREADS * 16


def group_mma_smem(k: int, tiles: int) -> int:
    """Dynamic shared memory of expert_group_mma: 8 inputs per n-tile, bf16 rows of K + pad."""
    return 8 * tiles * (k + GROUP_MMA_PAD) * 2


# With `group_mma_wide` in NINFER_KERNELS_ON: two n-tiles (16 inputs per pass) where their
# staging fits this, past the 48 KiB a launch gets without opting in, so the 35B gate-up (K =
# 2,048: 65 KiB for 16 inputs) reads an expert chosen by 9..16 of the step's rows once, not twice.
# Opt-in because it measured slower (run Z5, H100, 35B-A3B at 64 rows and 2k: 30.30 / 30.80 ms
# per step against 28.99 with one n-tile; the grouped kernel alone 461.9 against 456.4 µs): the
# synthetic model's routing is near uniform (~222 experts touched per layer, the largest group 7
# rows), so the second pass it saves almost never happens. The same bits either way (each input's
# column of the product is summed in the same order).
GROUP_MMA_WIDE_SMEM = 96 * 1024


def group_mma_tiles(k: int) -> int:
    """n-tiles per pass of expert_group_mma: two (16 inputs, so an expert chosen by up to 16 rows
    is read once) where their staging fits GROUP_SMEM (the 35B down projection, K = 512: 17 KiB),
    else one (its gate-up, K = 2,048: 16 rows need 65 KiB; 8 take 33 KiB); GROUP_MMA_WIDE_SMEM
    with `group_mma_wide` in NINFER_KERNELS_ON."""
    limit = GROUP_MMA_WIDE_SMEM if switched_on("group_mma_wide") else GROUP_SMEM
    return 2 if group_mma_smem(k, 2) <= limit else 1


@functools.cache
def _mma_capable_index(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (8, 0)


def _mma_capable(device: torch.device) -> bool:
    """mma.sync with bf16 operands needs sm_80+."""
    if device.type != "cuda":
        return False
    return _mma_capable_index(device.index if device.index is not None else 0)


def uses_group_mma(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `expert_group_gemv` runs the tensor-core kernel for operands `supports_group` takes:
    a bf16 model (fp32 inputs keep the CUDA-core kernel, whose products are exact in fp32; the mma
    would round them to bf16), one n-tile of staged inputs within GROUP_SMEM (K <= 3,040), and an
    sm_80+ device. K only needs to be a multiple of 8, as `supports_group` already asks."""
    return (
        x.dtype == torch.bfloat16
        and weight.dim() == 3
        and group_mma_smem(weight.shape[2], 1) <= GROUP_SMEM
        and _mma_capable(x.device)
    )


def supports_group_pair(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> bool:
    """Whether both grouped GEMVs of a MoE block (gate-up, then SwiGLU'd down) take the kernel."""
    k = down.shape[-1] if down.dim() == 3 else 0
    return (
        supports_group(x, gate_up)
        and _aligned_experts(down, x.dtype)
        and gate_up.shape[1] == 2 * k
        and GROUP_MAX_INPUTS * k * x.element_size() <= GROUP_SMEM
    )


def expert_group_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    expert_ids: torch.Tensor,
    *,
    rows_per_input: int,
    swiglu_input: bool = False,
    groups: tuple[torch.Tensor, torch.Tensor] | None = None,
    tensor_cores: bool = True,
    depth: int | None = None,
) -> torch.Tensor:
    """See `reference.expert_group_gemv`. The tensor-core kernel where `tensor_cores` and
    `uses_group_mma` say so (dispatch: `expert_group_mma` in NINFER_KERNELS_OFF turns it off), else
    the CUDA-core one. The tensor-core kernel's CP form unless `uses_cp_ring()` says otherwise;
    `depth` asks for the register ring at that depth instead (kernel_bench compares)."""
    device = rt.check_cuda(x, weight, expert_ids)
    if not supports_group(x, weight, swiglu_input=swiglu_input):
        raise rt.KernelInputError(
            f"grouped expert GEMV needs contiguous aligned [E, N, K] weights, K % 8 == 0, "
            f"{GROUP_MAX_INPUTS} x K inputs within {GROUP_SMEM} bytes and 16-byte aligned dense "
            f"input rows; got x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} "
            f"{weight.dtype}"
        )
    num_experts, n, k = weight.shape
    num_assignments = expert_ids.numel()
    if num_assignments != x.shape[0] * rows_per_input:
        raise rt.KernelInputError(
            f"{num_assignments} expert ids for {x.shape[0]} inputs x {rows_per_input} rows each"
        )
    out = torch.empty((num_assignments, n), dtype=x.dtype, device=device)
    if num_assignments == 0:
        return out
    order, ends = groups if groups is not None else expert_groups(expert_ids, num_experts)
    order = order.to(torch.int64).contiguous()
    ends = ends.to(torch.int32).contiguous()
    if order.numel() != num_assignments or ends.numel() != num_experts:
        raise rt.KernelInputError("groups do not match the expert ids and the experts")
    if depth is not None and depth not in GROUP_MMA_DEPTHS:
        raise rt.KernelInputError(f"depth {depth} is not one of {GROUP_MMA_DEPTHS}")
    swiglu = "true" if swiglu_input else "false"
    if tensor_cores and uses_group_mma(x, weight):
        tiles = group_mma_tiles(k)
        grid = (-(-n // GROUP_MMA_ROWS), num_experts)
        smem = group_mma_smem(k, tiles)
        if depth is None and uses_cp_ring():
            instance = f"expert_group_mma<{GROUP_MMA_CP_DEPTH}, {tiles}, {swiglu}, true>"
            smem += group_mma_cp_ring()
        else:
            instance = f"expert_group_mma<{depth or GROUP_MMA_DEPTH}, {tiles}, {swiglu}>"
        rt.allow_shared(OP, instance, rt.device_index(device), smem)
    else:
        rows = rows_per_warp(k)
        instance = (
            f"expert_group_gemv<{rt.cuda_type(x, 'x')}, {rows}, {GROUP_MAX_INPUTS}, {swiglu}>"
        )
        grid = (-(-n // (WARPS * rows)), num_experts)
        smem = GROUP_MAX_INPUTS * k * x.element_size()
    kernel = rt.get_kernel(OP, instance, device)
    args = (
        rt.ptr(out),
        rt.ptr(x),
        rt.i64(x.stride(0)),
        rt.ptr(weight),
        rt.ptr(order),
        rt.ptr(ends),
        rt.i32(rows_per_input),
        rt.i32(n),
        rt.i32(k),
    )
    rt.launch(kernel, grid, (THREADS,), args, device, shared_mem=smem)
    return out


# moe_combine's loads-first form (top_k <= 16: every load of a thread issued before its first add;
# the same adds in the same order as the loop, bit-equal on the GPU): on by default since run S39B
# (H100: the 35B-A3B 64-row step 0.997x with the chunk-table sort); `NINFER_KERNELS_OFF=
# combine_preload` runs the loop
COMBINE_PRELOAD = "combine_preload"


def supports_combine(
    y: torch.Tensor,
    weights: torch.Tensor,
    shared: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,
) -> bool:
    """Whether moe_combine takes these operands (otherwise the twin runs)."""
    if y.dtype not in rt.CUDA_TYPES or y.dim() != 2 or not y.is_contiguous() or weights.dim() != 2:
        return False
    num_tokens, top_k = weights.shape
    ok = y.shape[0] == num_tokens * top_k and num_tokens <= MAX_TOKENS
    return ok and _shared_fits(shared, shared_gate, y.dtype, num_tokens, y.shape[1])


def moe_combine(
    y: torch.Tensor,
    weights: torch.Tensor,
    *,
    shared: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """See `reference.moe_combine`."""
    device = rt.check_cuda(y, weights, shared, shared_gate)
    if not supports_combine(y, weights, shared, shared_gate):
        raise rt.KernelInputError(
            f"MoE combine needs dense expert outputs [T * k, H], weights [T, k] with T <= "
            f"{MAX_TOKENS} and a shared output [T, H] with gate [T, 1] (or neither); got y "
            f"{tuple(y.shape)} {y.dtype}, weights {tuple(weights.shape)}"
        )
    num_tokens, top_k = weights.shape
    n = y.shape[1]
    out = torch.empty((num_tokens, n), dtype=y.dtype, device=device)
    if num_tokens == 0:
        return out
    route_w = weights.reshape(-1).to(torch.float32).contiguous()
    preload = "false" if switched_off(COMBINE_PRELOAD) else "true"
    kernel = rt.get_kernel(OP, f"moe_combine<{rt.cuda_type(y, 'y')}, {preload}>", device)
    args = (
        rt.ptr(out),
        rt.ptr(y),
        rt.ptr(route_w),
        rt.ptr(shared),
        rt.i64(0 if shared is None else shared.stride(0)),
        rt.ptr(shared_gate),
        rt.i64(0 if shared_gate is None else shared_gate.stride(0)),
        rt.i32(top_k),
        rt.i32(n),
    )
    rt.launch(kernel, (-(-n // THREADS), num_tokens), (THREADS,), args, device)
    return out
