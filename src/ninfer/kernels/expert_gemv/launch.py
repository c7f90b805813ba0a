"""CUDA launcher of the grouped expert GEMV (grid: row tiles x assignments).

Imports torch and kernels.runtime. Same signature and results as `reference.expert_gemv` where
`supports` says yes (contiguous [E, N, K] weights, K a multiple of one 16-byte load, x fits in
shared memory); dispatch runs the twin otherwise.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt

OP = "expert_gemv"
ROWS = 4  # output rows per warp (independent 16-byte loads in flight per lane)
THREADS = 256
MAX_K = 12288  # x staged as fp32 in the 48 KiB of static-launch shared memory


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel takes these operands (otherwise the twin runs)."""
    if x.dtype != weight.dtype or weight.dtype not in rt.CUDA_TYPES or weight.dim() != 3:
        return False
    per_load = 16 // weight.element_size()
    k = weight.shape[2]
    return (
        weight.is_contiguous()
        and k % per_load == 0
        and k <= MAX_K
        and weight.data_ptr() % 16 == 0
        and x.shape[-1] == k
        and x.stride(-1) == 1
    )


def expert_gemv(
    x: torch.Tensor, weight: torch.Tensor, expert_ids: torch.Tensor, *, rows_per_input: int
) -> torch.Tensor:
    """See `reference.expert_gemv`."""
    device = rt.check_cuda(x, weight, expert_ids)
    if not supports(x, weight):
        raise rt.KernelInputError(
            f"expert GEMV needs contiguous aligned [E, N, K] weights with K % 8 == 0 and "
            f"K <= {MAX_K}, x rows dense and of the same dtype; got x {tuple(x.shape)} "
            f"{x.dtype}, weight {tuple(weight.shape)} {weight.dtype}"
        )
    num_assignments = expert_ids.numel()
    if num_assignments != x.shape[0] * rows_per_input:
        raise rt.KernelInputError(
            f"{num_assignments} expert ids for {x.shape[0]} inputs x {rows_per_input} rows each"
        )
    _, n, k = weight.shape
    ids = expert_ids.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty((num_assignments, n), dtype=x.dtype, device=device)
    if num_assignments == 0:
        return out
    kernel = rt.get_kernel(OP, f"expert_gemv<{rt.cuda_type(x, 'x')}, {ROWS}>", device)
    rows_per_block = (THREADS // 32) * ROWS
    args = (
        rt.ptr(out),
        rt.ptr(x),
        rt.i64(x.stride(0)),
        rt.ptr(weight),
        rt.ptr(ids),
        rt.i32(rows_per_input),
        rt.i32(n),
        rt.i32(k),
    )
    grid = (-(-n // rows_per_block), num_assignments)
    rt.launch(kernel, grid, (THREADS,), args, device, shared_mem=4 * k)
    return out
