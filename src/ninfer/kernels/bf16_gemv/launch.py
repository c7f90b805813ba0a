"""CUDA launcher of the bf16 GEMV (grid: row tiles; K split across the warps of a block).

Imports torch and kernels.runtime. Same signature and results (to bf16 output rounding) as
`reference.bf16_linear` (or, with `swiglu_input`, `reference.swiglu_linear`: x is a gate-up row
whose SwiGLU the kernel forms as it loads it) where `supports` says yes: bf16 x of 1..MAX_ROWS
dense 16-byte-aligned rows, a contiguous 16-byte-aligned bf16 weight [N, K] with K a multiple of
8 (whole 16-byte loads), both on one sm_80+ GPU (the L2 prefetch-size load qualifier). Where the
kernel should beat cuBLAS is a separate, measured question: `bf16_gemv_preferred` (dispatch asks
both).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.switches import switched_off, switched_on

OP = "bf16_gemv"
THREADS = 256  # 8 warps per block (the .cu's BF16_GEMV_WARPS)
WARPS = THREADS // 32
MAX_ROWS = 8  # x rows per launch (one template instance per count)
CHUNK = 8  # bf16 weights per 16-byte load
INPUT_SWIGLU, INPUT_SIGMOID_GATE = 1, 2  # the .cu's BF16_GEMV_SWIGLU, BF16_GEMV_SIGMOID_GATE
OPTION_L2_PREFETCH, OPTION_EARLY_LOADS = 1, 2  # the .cu's BF16_GEMV_L2_PREFETCH, _EARLY_LOADS
MAX_ROWS_PER_GROUP = 4  # R: M * R accumulators must fit one per lane (M * R <= 32)
# Opt-in one-row plan (for an H200 A/B): R = 8 rows per warp group with U = 1, the same 128 bytes
# of weight loads in flight per lane as R = 4, U = 2, but each x chunk loaded (and, in the fused
# input forms, each SwiGLU or sigmoid gate computed) once per 8 rows instead of 4. The H200
# profile of run S36F had the SwiGLU down projection at 3.59 TB/s against the plain form's 4.01.
# `NINFER_KERNELS_ON=gemv_rows8` takes it for every one-row launch (the fused forms keep the plain
# form's bits), `gemv_fused_rows8` for the SwiGLU and sigmoid-gate forms only (their sums then
# reduce in another order than the plain R = 4 launch: within the same bounds, other bits).
# nvcc -Xptxas -v (sm_90): <1, 8, 1, 0 / 1 / 2> 61 / 64 / 62 registers, no spills.
WIDE_ROWS_PER_GROUP, WIDE_UNROLL = 8, {1: 1}
MIN_BLOCKS_PER_SM = 2  # R is halved (down to 1) until the grid has this many blocks per SM
# U, 16-byte load steps per lane issued together, by x row count: the .cu's launch bounds give
# 1-4 rows 64-80 registers and 5-8 rows 128, and these are the U that fit them without spilling
UNROLL = {1: 2, 2: 2, 3: 2, 4: 2, 5: 1, 6: 1, 7: 1, 8: 1}

# Routing (dispatch.linear). One x row: every shape, since run S32 (docs/perf.md, H100): in the
# model the kernel beats cuBLAS on the 27B's wide projections too (gate-up 34,816 x 5,120, in_proj,
# qkv: batch-1 step 19.79 -> 18.70 ms, 18.34 with the early weight loads below), though cuBLAS
# led those shapes by 2-4 % in isolation (run X1, H200): the kernel overlaps the previous one's
# tail (PDL), cuBLAS does not. On the H200 the rule gains 1.5 % (S36B: 13.96 against 14.19 ms).
# `NINFER_KERNELS_OFF=gemv_one_row` restores the per-kernel table:
# up to ONE_ROW_MAX_OUT outputs at any K, up to SHORT_K_MAX_OUT for K <= SHORT_K (runs T3, U2).
# Two or more rows: cuBLAS reuses each weight load across the rows and wins from 5120 x 6144 up
# (23.3 against 18.0 µs at 4 rows; 12352 x 2048: 27.5 against 16.2), while the kernel still wins
# on small matrices up to 8 rows (2048 x 4096: 9.2 against 9.6; 1024 x 2048: 4.7 against 5.8; 257
# x 2048: 2.7 against 8.2), hence a weight-count limit. 2 and 3 rows were not measured and follow 4.
ONE_ROW_MAX_OUT = 8192
SHORT_K, SHORT_K_MAX_OUT = 2048, 16384
MULTI_ROW_MAX_WEIGHTS = 2048 * 4096


@dataclass(frozen=True)
class Plan:
    """A launch's shape: R rows per warp group, 2**ks_log2 warps per group splitting K, U steps."""

    rows_per_group: int
    ks_log2: int
    unroll: int
    blocks: int

    @property
    def rows_per_block(self) -> int:
        return (WARPS >> self.ks_log2) * self.rows_per_group


def plan(
    num_rows: int,
    n: int,
    k: int,
    num_sms: int,
    *,
    chunk: int = CHUNK,
    unroll: dict[int, int] = UNROLL,
    max_rows_per_group: int = MAX_ROWS_PER_GROUP,
) -> Plan:
    """The launch for x [num_rows, k] against W [n, k] on a GPU of `num_sms` SMs; `chunk` is the
    weights per 16-byte load, `unroll` the U by x rows (fp8_split_gemv: 16 and its own) and
    `max_rows_per_group` the R it starts from (the opt-in `wide_rows` plan: 8).

    K split: as many warps per group (8, 4, 2, 1) as keep every lane on at least one 16-byte chunk
    of the row (8 from K = 2048 up), so short rows (K = 512) do not leave most lanes idle. Rows
    per group: 4 (four loads in flight per lane and step), halved while the grid would have fewer
    than MIN_BLOCKS_PER_SM blocks per SM (small N: more, smaller blocks keep the SMs busy).
    """
    chunks = k // chunk
    ks_log2 = 3
    while ks_log2 > 0 and 32 << ks_log2 > chunks:
        ks_log2 -= 1
    groups = WARPS >> ks_log2
    rows = max_rows_per_group
    while rows > 1 and -(-n // (groups * rows)) < MIN_BLOCKS_PER_SM * num_sms:
        rows //= 2
    return Plan(rows, ks_log2, unroll[num_rows], -(-n // (groups * rows)))


def wide_rows(num_rows: int, *, fused: bool) -> bool:
    """Whether a launch of `num_rows` x rows (in a fused input form or not) takes the opt-in
    R = 8 plan (see WIDE_ROWS_PER_GROUP): one row only, and only where switched on."""
    if num_rows != 1:
        return False
    return switched_on("gemv_rows8") or (fused and switched_on("gemv_fused_rows8"))


def launch_options() -> int:
    """The kernel's `options` bits. Early loads (the first U steps of weight loads into registers
    before the dependency wait) are on unless `NINFER_KERNELS_OFF=gemv_early_loads`: with every
    one-row projection here they took the 27B batch-1 step from 18.70 to 18.34 ms and the 35B-A3B
    one from 3.19 to 3.15 (run S32, H100). `gemv_prefetch` (the first weight lines into L2
    before the wait) is opt-in: slower in runs V2 and S32. Neither changes a result: the same
    loads in the same order."""
    return (OPTION_L2_PREFETCH if switched_on("gemv_prefetch") else 0) | (
        0 if switched_off("gemv_early_loads") else OPTION_EARLY_LOADS
    )


def bf16_gemv_preferred(num_rows: int, out_features: int, in_features: int) -> bool:
    """Whether dispatch should run the kernel rather than cuBLAS for this decode-sized shape.

    A measured choice, kept in one place (the routing notes above): one row always (the kernel
    splits K across warps, so small N keeps loads in flight too, and it overlaps its predecessor
    where cuBLAS cannot); from two x rows up cuBLAS's tiles reuse every weight load, so only small
    matrices. Operand limits are `supports`' business.
    """
    if not 1 <= num_rows <= MAX_ROWS or out_features < 1:
        return False
    if num_rows > 1:
        return out_features * in_features <= MULTI_ROW_MAX_WEIGHTS
    if not switched_off("gemv_one_row"):
        return True
    limit = SHORT_K_MAX_OUT if in_features <= SHORT_K else ONE_ROW_MAX_OUT
    return out_features <= limit


def operand_problem(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    max_rows: int,
    kernel: str,
    swiglu_input: bool = False,
) -> str | None:
    """Why a bf16 GEMV kernel (this one, or `bf16_mma_gemv` with its own row limit) cannot take
    x [M, K] against a weight [N, K], or None when it can; with `swiglu_input` x is [M, 2K] (gate
    then up). The device checks come last, so the operand messages show on the CPU."""
    if x.dim() != 2 or weight.dim() != 2:
        return f"x and weight must be 2-D, got {tuple(x.shape)} and {tuple(weight.shape)}"
    if x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16:
        return f"x and weight must be bfloat16, got {x.dtype} and {weight.dtype}"
    num_rows, width = x.shape
    n, k = weight.shape
    if not 1 <= num_rows <= max_rows:
        return f"x has {num_rows} rows; the {kernel} takes 1..{max_rows}"
    if width != (2 * k if swiglu_input else k):
        what = "a [gate | up] x" if swiglu_input else "x"
        return f"{what} {tuple(x.shape)} does not match weight {tuple(weight.shape)}"
    if n < 1 or k < CHUNK or k % CHUNK:
        return f"weight {tuple(weight.shape)}: needs N >= 1 and K a positive multiple of {CHUNK}"
    if x.stride(1) != 1 or x.data_ptr() % 16:
        return "x rows must be dense and 16-byte aligned"
    if num_rows > 1 and (x.stride(0) * x.element_size()) % 16:
        return f"x row stride {x.stride(0)} is not a multiple of 16 bytes"
    if not weight.is_contiguous() or weight.data_ptr() % 16:
        return "weight must be contiguous and 16-byte aligned"
    if x.device != weight.device or x.device.type != "cuda":
        return f"operands must share one CUDA device, got {x.device} and {weight.device}"
    if torch.cuda.get_device_capability(x.device) < (8, 0):
        return f"the {kernel} needs an sm_80+ GPU"
    return None


def _problem(x: torch.Tensor, weight: torch.Tensor, swiglu_input: bool = False) -> str | None:
    """Why this kernel cannot take these operands (`operand_problem`), or None when it can."""
    return operand_problem(
        x, weight, max_rows=MAX_ROWS, kernel="bf16 GEMV", swiglu_input=swiglu_input
    )


def gate_problem(x: torch.Tensor, gate: torch.Tensor) -> str | None:
    """Why a sigmoid gate [M, H, D] cannot go with x [M, H * D], or None when it can."""
    if gate.dim() != 3 or gate.dtype != torch.bfloat16 or gate.device != x.device:
        return f"gate must be a bf16 [M, H, D] on x's device, got {gate.dtype} {tuple(gate.shape)}"
    num_rows, heads, head_dim = gate.shape
    if num_rows != x.shape[0] or heads * head_dim != x.shape[1]:
        return f"gate {tuple(gate.shape)} does not match x {tuple(x.shape)}"
    if head_dim % CHUNK or gate.stride(2) != 1:
        return f"gate heads must be dense runs of a multiple of {CHUNK} elements"
    if gate.data_ptr() % 16 or (gate.stride(0) * 2) % 16 or (gate.stride(1) * 2) % 16:
        return "gate rows and heads must be 16-byte aligned"
    return None


def supports(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    swiglu_input: bool = False,
    gate: torch.Tensor | None = None,
) -> bool:
    """Whether the kernel takes these operands (otherwise the twin runs)."""
    if _problem(x, weight, swiglu_input) is not None:
        return False
    return gate is None or (not swiglu_input and gate_problem(x, gate) is None)


def swiglu_output_problem(x: torch.Tensor, gate_up: torch.Tensor) -> str | None:
    """Why `gate_up_swiglu` cannot take x [M, K] against a gate-up weight [2I, K], or None."""
    problem = _problem(x, gate_up)
    if problem is not None:
        return problem
    n, k = gate_up.shape
    if n % 2:
        return f"a gate-up weight has an even row count, got {tuple(gate_up.shape)}"
    if _launch_plan(x.shape[0], n, k, x.device, fused=False).rows_per_group < 2:
        return f"gate-up weight {tuple(gate_up.shape)} is too small for pairs of rows per group"
    return None


def _launch_plan(num_rows: int, n: int, k: int, device: torch.device, *, fused: bool) -> Plan:
    """The plan a launch takes: the opt-in eight-row one where `wide_rows` says so. The SwiGLU
    output form asks as the plain form (`fused` False): the same R, so the same bits."""
    if wide_rows(num_rows, fused=fused):
        return plan(num_rows, n, k, rt.num_sms(device), unroll=WIDE_UNROLL,
                    max_rows_per_group=WIDE_ROWS_PER_GROUP)  # fmt: skip
    return plan(num_rows, n, k, rt.num_sms(device))


def _launch(
    instance: str,
    p: Plan,
    out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """One launch of `instance` (the .cu's argument list, every form's) on plan `p`."""
    device = x.device
    n, k = weight.shape
    args = (
        rt.ptr(out),
        rt.ptr(x),
        rt.i64(x.stride(0)),
        rt.ptr(weight),
        rt.i32(n),
        rt.i32(k),
        rt.i32(p.ks_log2),
        rt.ptr(gate),
        rt.i64(gate.stride(0) if gate is not None else 0),
        rt.i64(gate.stride(1) if gate is not None else 0),
        rt.i32(gate.shape[2] if gate is not None else 0),
        rt.i32(launch_options()),
    )
    rt.launch(rt.get_kernel(OP, instance, device), (p.blocks,), (THREADS,), args, device)
    return out


def gate_up_swiglu(x: torch.Tensor, gate_up: torch.Tensor) -> torch.Tensor:
    """swiglu(x @ gate_up.T) [M, I] for a dense MLP's gate-up weight [2I, K] (gate rows, then up
    rows): the .cu's SWIGLU_OUT form, bit for bit `silu_mul(bf16_linear(x, gate_up))` (see the
    .cu's header), in one launch that leaves the down projection a plain GEMV."""
    device = rt.check_cuda(x, gate_up)
    problem = swiglu_output_problem(x, gate_up)
    if problem is not None:
        raise rt.KernelInputError(f"bf16 GEMV (SwiGLU output): {problem}")
    num_rows = x.shape[0]
    n, k = gate_up.shape
    out = torch.empty((num_rows, n // 2), dtype=x.dtype, device=device)
    p = _launch_plan(num_rows, n, k, device, fused=False)
    instance = f"bf16_gemv<{num_rows}, {p.rows_per_group}, {p.unroll}, 0, true>"
    return _launch(instance, p, out, x, gate_up)


def bf16_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    swiglu_input: bool = False,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """See `reference.bf16_linear`, or `reference.swiglu_linear` with `swiglu_input`, or
    `reference.sigmoid_gate_linear` with a `gate` [M, H, D] (x then being [M, H * D]): [M, N]."""
    device = rt.check_cuda(x, weight)
    problem = _problem(x, weight, swiglu_input)
    if problem is None and gate is not None:
        problem = "one input form at a time" if swiglu_input else gate_problem(x, gate)
    if problem is not None:
        raise rt.KernelInputError(f"bf16 GEMV: {problem}")
    num_rows = x.shape[0]
    n, k = weight.shape
    out = torch.empty((num_rows, n), dtype=x.dtype, device=device)
    form = INPUT_SWIGLU if swiglu_input else INPUT_SIGMOID_GATE if gate is not None else None
    p = _launch_plan(num_rows, n, k, device, fused=form is not None)
    suffix = f", {form}" if form is not None else ""
    instance = f"bf16_gemv<{num_rows}, {p.rows_per_group}, {p.unroll}{suffix}>"
    return _launch(instance, p, out, x, weight, gate)
