"""CUDA launcher of the sigmoid-gate kernel (one pass over strided o and gate, dense output).

Imports torch and kernels.runtime. Same signature as `reference.sigmoid_gate`, results rounded
as the twin rounds up to the fast exp (a gated element can land one bf16 ulp from torch's), for
what `supports` takes: bf16 [T, H, D] o and gate on one CUDA device, each head a dense run of a
multiple of 8 elements, rows and heads 16-byte aligned.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt

OP = "sigmoid_gate"
THREADS = 256
VEC = 8  # bf16 per 16-byte vector
MAX_GRID_Y = 65_535


def _aligned(t: torch.Tensor) -> bool:
    return t.data_ptr() % 16 == 0 and all((s * 2) % 16 == 0 for s in t.stride()[:2])


def problem(o: torch.Tensor, gate: torch.Tensor) -> str | None:
    """Why the kernel cannot take these operands, or None when it can."""
    if o.dim() != 3 or gate.shape != o.shape:
        return f"o and gate must both be [T, H, D], got {tuple(o.shape)} and {tuple(gate.shape)}"
    if o.dtype != torch.bfloat16 or gate.dtype != torch.bfloat16:
        return f"o and gate must be bfloat16, got {o.dtype} and {gate.dtype}"
    if o.device != gate.device or o.device.type != "cuda":
        return f"operands must share one CUDA device, got {o.device} and {gate.device}"
    if o.shape[2] % VEC or o.stride(2) != 1 or gate.stride(2) != 1:
        return f"heads must be dense runs of a multiple of {VEC} elements"
    if not (_aligned(o) and _aligned(gate)):
        return "o and gate rows and heads must be 16-byte aligned"
    return None


def supports(o: torch.Tensor, gate: torch.Tensor) -> bool:
    return problem(o, gate) is None


def sigmoid_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """See `reference.sigmoid_gate`: [T, H * D] bf16, dense."""
    device = rt.check_cuda(o, gate)
    why = problem(o, gate)
    if why is not None:
        raise rt.KernelInputError(f"sigmoid gate: {why}")
    num_rows, heads, head_dim = o.shape
    width = heads * head_dim
    x = torch.empty((num_rows, width), dtype=o.dtype, device=device)
    if num_rows == 0 or width == 0:
        return x
    vecs = width // VEC
    threads = min(THREADS, -(-vecs // 32) * 32)
    args = (
        rt.ptr(x),
        rt.ptr(o),
        rt.i64(o.stride(0)),
        rt.i64(o.stride(1)),
        rt.ptr(gate),
        rt.i64(gate.stride(0)),
        rt.i64(gate.stride(1)),
        rt.i32(head_dim),
        rt.i32(width),
        rt.i32(num_rows),
    )
    grid = (-(-vecs // threads), min(num_rows, MAX_GRID_Y))
    rt.launch(rt.get_kernel(OP, "sigmoid_gate", device), grid, (threads,), args, device)
    return x
