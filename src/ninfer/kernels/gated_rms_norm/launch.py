"""CUDA launcher of the gated RMSNorm (one warp per row where it fits, else one block per row).

Imports torch and kernels.runtime. Same signature and results as `reference.gated_rms_norm`; x,
gate and weight may each be float32 or bfloat16 (the kernel is instantiated per combination);
gate may be a [T, H, n] view with a wide token stride (read in place, see `_gate_layout`). The
launch shape is a pure function of sizes and addresses (`plan_launch`) so it is tested on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ninfer.kernels import runtime as rt

OP = "gated_rms_norm"
PER_LANE_CHOICES = (1, 2, 4, 8)  # elements per lane of the warp kernel (template instances)
WARPS_PER_BLOCK = 4  # rows per block of the warp kernel (its __launch_bounds__ allows 8)


class LaunchPlan(NamedTuple):
    """`per_lane` > 0: the warp kernel with that many elements a lane; 0: the block kernel."""

    per_lane: int
    grid: tuple[int, ...]
    block: tuple[int, ...]


def plan_launch(n: int, num_rows: int, spans: Sequence[tuple[int, int]]) -> LaunchPlan:
    """The warp kernel when n is 32 x (1, 2, 4 or 8) and every span is chunk-aligned.

    `spans`: (byte address or byte stride, element size) of each pointer and stride the warp
    kernel steps by; each must be a multiple of a lane's chunk (per_lane x element size), which
    is the alignment the kernel's vector loads assume. Otherwise one block per row.
    """
    per_lane = n // 32
    if (
        n % 32 == 0
        and per_lane in PER_LANE_CHOICES
        and num_rows < 2**31
        and all(offset % (per_lane * size) == 0 for offset, size in spans)
    ):
        grid = (-(-num_rows // WARPS_PER_BLOCK),)
        return LaunchPlan(per_lane, grid, (32 * WARPS_PER_BLOCK,))
    return LaunchPlan(0, (num_rows,), (rt.block_size(n),))


def _gate_layout(gate: torch.Tensor) -> tuple[int, int]:
    """(rows per outer step, outer stride) reading `gate` in place, or (0, 0) if it must be copied.

    Contiguous: (1, n). A [T, H, n] view with dense heads and any token stride (z sliced out of
    the fused DeltaNet projection): (H, token stride).
    """
    n = gate.shape[-1]
    if gate.is_contiguous():
        return 1, n
    if gate.dim() == 3 and gate.stride(2) == 1 and gate.stride(1) == n:
        return gate.shape[1], gate.stride(0)
    return 0, 0


def gated_rms_norm(
    x: torch.Tensor,
    gate: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """See `reference.gated_rms_norm`."""
    device = rt.check_cuda(x, gate, weight)
    n = x.shape[-1]
    if gate.shape != x.shape:
        raise rt.KernelInputError(f"gate shape {tuple(gate.shape)} != x shape {tuple(x.shape)}")
    if weight.shape != (n,):
        raise rt.KernelInputError(f"weight shape {tuple(weight.shape)} != [{n}]")
    gate_inner, gate_outer = _gate_layout(gate)
    if gate_inner == 0:
        gate = gate.contiguous()
        gate_inner, gate_outer = 1, n
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=device)
    num_rows = x.numel() // n if n else 0
    if num_rows == 0:
        return out
    types = ", ".join(
        rt.cuda_type(t, name)
        for t, name in ((x, "x"), (gate, "gate"), (weight, "weight"), (out, "out"))
    )
    spans = [(t.data_ptr(), t.element_size()) for t in (out, x, gate, weight)]
    spans.append((gate_outer * gate.element_size(), gate.element_size()))
    plan = plan_launch(n, num_rows, spans)
    if plan.per_lane:
        kernel = rt.get_kernel(OP, f"gated_rms_norm_warp<{types}, {plan.per_lane}>", device)
        size = rt.i32(num_rows)  # the warp kernel's n is its template's 32 x per_lane
    else:
        kernel = rt.get_kernel(OP, f"gated_rms_norm<{types}>", device)
        size = rt.i32(n)
    args = (
        rt.ptr(out),
        rt.ptr(x),
        rt.ptr(gate),
        rt.ptr(weight),
        size,
        rt.f32(eps),
        rt.i32(gate_inner),
        rt.i64(gate_outer),
    )
    rt.launch(kernel, plan.grid, plan.block, args, device)
    return out
