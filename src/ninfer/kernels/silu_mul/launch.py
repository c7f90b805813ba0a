"""CUDA launcher of the SwiGLU activation (16-byte vectors where aligned, else one thread each).

Imports torch and kernels.runtime. Same signature and results as `reference.silu_mul` for 2-D
inputs whose rows are dense (a GEMM output or a column slice of one); others are made so. The
launch shape is a pure function of sizes and addresses (`plan_launch`) so it is tested on the CPU.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ninfer.kernels import runtime as rt

OP = "silu_mul"
VEC_BYTES = 16
VEC_THREADS = 256  # the vector kernel's __launch_bounds__
SCALAR_THREADS = 256
MAX_GRID_Y = 65_535  # CUDA's grid y limit; the vector kernel loops over rows beyond it


class LaunchPlan(NamedTuple):
    """Which kernel (`silu_mul_vec` or `silu_mul`) and its grid and block shape."""

    kernel: str
    grid: tuple[int, ...]
    block: tuple[int, ...]


def plan_launch(
    num_rows: int, inter: int, row_stride: int, data_ptr: int, element_size: int
) -> LaunchPlan:
    """Vector kernel when every row's gate and up halves start on a 16-byte boundary.

    That needs the base address, the row stride and `inter` all aligned; a column slice at an
    odd offset or a row stride of odd length falls back to the scalar kernel, which is exact too.
    """
    per_vec = VEC_BYTES // element_size
    if (
        inter % per_vec == 0
        and row_stride % per_vec == 0
        and data_ptr % VEC_BYTES == 0
        and num_rows < 2**31
    ):
        num_vecs = inter // per_vec
        threads = min(VEC_THREADS, -(-num_vecs // 32) * 32)
        return LaunchPlan(
            "silu_mul_vec", (-(-num_vecs // threads), min(num_rows, MAX_GRID_Y)), (threads,)
        )
    total = num_rows * inter
    return LaunchPlan("silu_mul", (-(-total // SCALAR_THREADS),), (SCALAR_THREADS,))


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """See `reference.silu_mul`."""
    device = rt.check_cuda(gate_up)
    width = gate_up.shape[-1]
    if width % 2:
        raise rt.KernelInputError(f"gate-up width {width} is odd")
    lead = gate_up.shape[:-1]
    x = gate_up.reshape(-1, width) if gate_up.dim() != 2 else gate_up
    if x.stride(-1) != 1:
        x = x.contiguous()
    inter = width // 2
    out = torch.empty((*lead, inter), dtype=gate_up.dtype, device=device)
    total = out.numel()
    if total == 0:
        return out
    num_rows = total // inter
    type_name = rt.cuda_type(x, "gate_up")
    plan = plan_launch(num_rows, inter, x.stride(0), x.data_ptr(), x.element_size())
    kernel = rt.get_kernel(OP, f"{plan.kernel}<{type_name}>", device)
    if plan.kernel == "silu_mul_vec":
        args = (rt.ptr(out), rt.ptr(x), rt.i64(x.stride(0)), rt.i32(inter), rt.i32(num_rows))
    else:
        args = (rt.ptr(out), rt.ptr(x), rt.i64(x.stride(0)), rt.i32(inter), rt.i64(total))
    rt.launch(kernel, plan.grid, plan.block, args, device)
    return out
