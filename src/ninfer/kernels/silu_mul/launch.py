"""CUDA launcher of the SwiGLU activation (one thread per output element).

Imports torch and kernels.runtime. Same signature and results as `reference.silu_mul` for 2-D
inputs whose rows are dense (a GEMM output or a column slice of one); others are made so.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt

OP = "silu_mul"
THREADS = 256


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
    kernel = rt.get_kernel(OP, f"silu_mul<{rt.cuda_type(x, 'gate_up')}>", device)
    args = (rt.ptr(out), rt.ptr(x), rt.i64(x.stride(0)), rt.i32(inter), rt.i64(total))
    rt.launch(kernel, (-(-total // THREADS),), (THREADS,), args, device)
    return out
