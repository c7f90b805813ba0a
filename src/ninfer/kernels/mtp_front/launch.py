"""CUDA launcher of the MTP front kernel: `reference.mtp_front` in one launch, the same bits.

Imports torch, kernels.runtime and the add_rms_norm launcher (whose one-pass shape the halves
reproduce). `problem` names operands the kernel does not take (dispatch then runs the twin).
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.add_rms_norm.launch import vec_plan

OP = "mtp_front"
HEADERS = ("add_rms_norm/norm_row.cu",)
THREADS = 256  # the .cu's launch bounds and add_rms_norm_row's BLOCK


def problem(
    ids: torch.Tensor,
    embed: torch.Tensor,
    hidden: torch.Tensor,
    embed_norm: torch.Tensor,
    hidden_norm: torch.Tensor,
) -> str | None:
    """Why the kernel cannot take these operands, or None."""
    n = embed.shape[-1]
    if ids.dtype != torch.int64 or ids.dim() != 1 or not ids.is_contiguous():
        return "ids must be a contiguous [T] int64 tensor"
    tensors = (embed, hidden, embed_norm, hidden_norm)
    if any(t.dtype != torch.bfloat16 for t in tensors):
        return "embedding, hidden and norm weights must be bf16"
    if hidden.shape != (ids.shape[0], n) or embed_norm.shape != (n,) or hidden_norm.shape != (n,):
        return f"hidden [{ids.shape[0]}, {n}] and norm weights [{n}] expected"
    if vec_plan(n, 2) is None:
        return f"rows of {n}: add_rms_norm's one-pass shape needs n % 8 == 0, n <= 32768"
    if not (embed.is_contiguous() and embed_norm.is_contiguous() and hidden_norm.is_contiguous()):
        return "embedding and norm weights must be contiguous"
    if hidden.stride(1) != 1 or (hidden.stride(0) * 2) % 16:
        return "hidden rows must be dense, 16-byte-aligned strides"
    if any(t.data_ptr() % 16 for t in tensors):
        return "embedding, hidden and norm weights must be 16-byte aligned"
    if any(t.device != ids.device for t in tensors):
        return "operands must share one device"
    return None


def mtp_front(
    ids: torch.Tensor,
    embed: torch.Tensor,
    hidden: torch.Tensor,
    embed_norm: torch.Tensor,
    hidden_norm: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """See `reference.mtp_front`."""
    device = rt.check_cuda(ids, embed, hidden, embed_norm, hidden_norm)
    why = problem(ids, embed, hidden, embed_norm, hidden_norm)
    if why is not None:
        raise rt.KernelInputError(f"mtp_front: {why}")
    num, n = hidden.shape
    out = torch.empty((num, 2 * n), dtype=embed.dtype, device=device)
    if num == 0:
        return out
    plan = vec_plan(n, 2)
    assert plan is not None
    kernel = rt.get_kernel(OP, f"mtp_front<{plan.chunks}, {plan.num_threads}>", device, HEADERS)
    args = (
        rt.ptr(out),
        rt.ptr(ids),
        rt.ptr(embed),
        rt.ptr(hidden),
        rt.i64(hidden.stride(0)),
        rt.ptr(embed_norm),
        rt.ptr(hidden_norm),
        rt.i32(n),
        rt.f32(eps),
    )
    rt.launch(kernel, (num, 2), (THREADS,), args, device)
    return out
