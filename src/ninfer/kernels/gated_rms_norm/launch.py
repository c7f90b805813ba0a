"""CUDA launcher of the gated RMSNorm (one block per row).

Imports torch and kernels.runtime. Same signature and results as `reference.gated_rms_norm`; x,
gate and weight may each be float32 or bfloat16 (the kernel is instantiated per combination);
gate may be a [T, H, n] view with a wide token stride (read in place, see `_gate_layout`).
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt

OP = "gated_rms_norm"


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
    kernel = rt.get_kernel(OP, f"gated_rms_norm<{types}>", device)
    args = (
        rt.ptr(out),
        rt.ptr(x),
        rt.ptr(gate),
        rt.ptr(weight),
        rt.i32(n),
        rt.f32(eps),
        rt.i32(gate_inner),
        rt.i64(gate_outer),
    )
    rt.launch(kernel, (num_rows,), (rt.block_size(n),), args, device)
    return out
