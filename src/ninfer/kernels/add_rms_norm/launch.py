"""CUDA launcher of the fused residual add + zero-centred RMSNorm (one block per row).

Imports torch and kernels.runtime. Same signature and results as `reference.add_rms_norm`; rows
must be contiguous (a non-contiguous input is copied first, which a caller should avoid).
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt

OP = "add_rms_norm"


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
    kernel = rt.get_kernel(OP, f"add_rms_norm<{dtype_name}, {has_residual}>", device)
    args = (
        rt.ptr(out),
        rt.ptr(summed if residual is not None else None),
        rt.ptr(x),
        rt.ptr(residual),
        rt.ptr(weight),
        rt.i32(n),
        rt.f32(eps),
    )
    rt.launch(kernel, (num_rows,), (rt.block_size(n),), args, device)
    return out, summed
