"""CUDA launcher of the fused residual add + zero-centred RMSNorm (one block per row).

Imports torch and kernels.runtime. Same signature and results as `reference.add_rms_norm`; rows
must be contiguous (a non-contiguous input is copied first, which a caller should avoid). Rows
that fit 512 threads x 8 vectors of 16 bytes (decode rows: 27B's 5,120, 35B's 2,048) run the
one-pass kernel holding the row in registers; anything else runs the two-pass row kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ninfer.kernels import runtime as rt

OP = "add_rms_norm"
VEC_BYTES = 16
MAX_VEC_THREADS = 512  # the kernel's __launch_bounds__
CHUNK_CHOICES = (1, 2, 4, 8)  # 16-byte vectors per thread (template instances)


class VecPlan(NamedTuple):
    """Launch shape of the register-resident kernel: vectors per thread, threads per block."""

    chunks: int
    num_threads: int


def vec_plan(n: int, element_size: int) -> VecPlan | None:
    """The one-pass kernel's shape for rows of n elements, or None where it does not apply.

    Fewest vectors per thread (most threads, each load in flight at once) within 512 threads.
    """
    per_vec = VEC_BYTES // element_size
    if n <= 0 or n % per_vec:
        return None
    num_vecs = n // per_vec
    for chunks in CHUNK_CHOICES:
        threads = -(-num_vecs // chunks)
        if threads <= MAX_VEC_THREADS:
            return VecPlan(chunks, max(32, -(-threads // 32) * 32))
    return None


def _aligned(*tensors: torch.Tensor | None) -> bool:
    return all(t is None or t.data_ptr() % VEC_BYTES == 0 for t in tensors)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """See `reference.add_rms_norm`; x, residual and weight share a dtype after the cast below."""
    device = rt.check_cuda(x, residual, weight)
    dtype_name = rt.cuda_type(x, "x")
    n = x.shape[-1]
    if weight.shape != (n,):
        raise rt.KernelInputError(f"weight shape {tuple(weight.shape)} != [{n}]")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise rt.KernelInputError("residual must match x in shape and dtype")
    x = x.contiguous()
    residual = residual.contiguous() if residual is not None else None
    weight = weight.to(x.dtype).contiguous()
    out = torch.empty_like(x)
    summed = torch.empty_like(x) if residual is not None else x
    num_rows = x.numel() // n if n else 0
    if num_rows == 0:
        return out, summed
    has_residual = "true" if residual is not None else "false"
    args = (
        rt.ptr(out),
        rt.ptr(summed if residual is not None else None),
        rt.ptr(x),
        rt.ptr(residual),
        rt.ptr(weight),
        rt.i32(n),
        rt.f32(eps),
    )
    plan = vec_plan(n, x.element_size())
    if plan is not None and _aligned(out, summed, x, residual, weight):
        instance = f"add_rms_norm_vec<{dtype_name}, {has_residual}, {plan.chunks}>"
        block = plan.num_threads
    else:
        instance = f"add_rms_norm_rows<{dtype_name}, {has_residual}>"
        block = rt.block_size(n)
    kernel = rt.get_kernel(OP, instance, device)
    rt.launch(kernel, (num_rows,), (block,), args, device)
    return out, summed
