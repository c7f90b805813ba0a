"""CUDA launcher of the Gated DeltaNet decode front (grid: channel groups x rows).

Imports torch, kernels.runtime and the twin's result type. Same signature and results as
`reference.gdn_decode_front`. qkv, a and b may be column slices of one fused projection output
(rows strided, columns dense), so the merged in_proj GEMM's result is read in place.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.gdn_decode_front.reference import L2_EPS, DecodeFront

OP = "gdn_decode_front"


def _dense_rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 2 and t.stride(1) == 1 else t.contiguous()


class FrontOperands(NamedTuple):
    """A front launch's checked inputs, its outputs, and the dims both launchers pass."""

    out: DecodeFront
    inputs: tuple[torch.Tensor, ...]  # qkv, a, b, conv_weight, a_log, dt_bias (kernel-ready)
    slots: torch.Tensor
    num_v_heads: int
    value_dim: int
    taps: int


def front_operands(
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    num_k_heads: int,
    head_k_dim: int,
    max_taps: int = 1024,
) -> FrontOperands:
    """Check a decode or verify front's inputs (qkv, a, b: [rows, ...]) and allocate its
    outputs; the verify front (kernels/gated_delta_verify) shares this with the decode front."""
    device = rt.check_cuda(qkv, a, b, conv_weight, a_log, dt_bias, conv_state, state_slots)
    num_rows, num_channels = qkv.shape
    num_v_heads = a.shape[-1]
    taps = conv_weight.shape[1]
    value_channels = num_channels - 2 * num_k_heads * head_k_dim
    if value_channels <= 0 or value_channels % num_v_heads:
        raise rt.KernelInputError(f"{num_channels} qkv channels do not split into q, k and v")
    if a.shape != (num_rows, num_v_heads) or b.shape != a.shape:
        raise rt.KernelInputError(f"a {tuple(a.shape)} and b {tuple(b.shape)} must be [B, Hv]")
    if conv_weight.shape != (num_channels, taps) or not 2 <= taps <= max_taps:
        raise rt.KernelInputError(
            f"conv weight {tuple(conv_weight.shape)} != [C, K] with K in 2..{max_taps}"
        )
    if conv_state.shape[1:] != (num_channels, taps - 1) or not conv_state.is_contiguous():
        raise rt.KernelInputError("conv_state must be a contiguous [S, C, K-1] tensor")
    if head_k_dim > 1024 or b.dtype != qkv.dtype or a.dtype != qkv.dtype:
        raise rt.KernelInputError("a, b and qkv must share a dtype; head_k_dim at most 1024")
    value_dim = value_channels // num_v_heads
    q = torch.empty((num_rows, num_k_heads, head_k_dim), dtype=torch.float32, device=device)
    out = DecodeFront(
        q,
        torch.empty_like(q),
        torch.empty((num_rows, num_v_heads, value_dim), dtype=qkv.dtype, device=device),
        torch.empty((num_rows, num_v_heads), dtype=torch.float32, device=device),
        torch.empty((num_rows, num_v_heads), dtype=torch.float32, device=device),
    )
    inputs = (
        _dense_rows(qkv),
        _dense_rows(a),
        _dense_rows(b),
        conv_weight.contiguous(),
        a_log.float().contiguous(),
        dt_bias.float().contiguous(),
    )
    slots = state_slots.to(torch.int64).contiguous()
    return FrontOperands(out, inputs, slots, num_v_heads, value_dim, taps)


def front_instance(name: str, ops: FrontOperands, conv_state: torch.Tensor) -> str:
    qkv, conv_weight = ops.inputs[0], ops.inputs[3]
    types = ", ".join(
        rt.cuda_type(t, n)
        for t, n in ((qkv, "qkv"), (conv_state, "conv_state"), (conv_weight, "conv_weight"))
    )
    return f"{name}<{types}>"


def front_args(
    ops: FrontOperands, conv_state: torch.Tensor, *, width: int | None, num_k_heads: int,
    head_k_dim: int,
) -> tuple:  # fmt: skip
    """The kernel arguments (`width`: the verify front's column count; None for decode)."""
    qkv, a, b, conv_weight, a_log, dt_bias = ops.inputs
    return (
        *(rt.ptr(t) for t in ops.out),
        rt.ptr(conv_state),
        rt.ptr(qkv),
        rt.i64(qkv.stride(0)),
        rt.ptr(a),
        rt.i64(a.stride(0)),
        rt.ptr(b),
        rt.i64(b.stride(0)),
        rt.ptr(conv_weight),
        rt.ptr(a_log),
        rt.ptr(dt_bias),
        rt.ptr(ops.slots),
        *(() if width is None else (rt.i32(width),)),
        rt.i32(num_k_heads),
        rt.i32(head_k_dim),
        rt.i32(ops.num_v_heads),
        rt.i32(ops.value_dim),
        rt.i32(ops.taps),
        rt.f32(L2_EPS),
    )


def front_grid(ops: FrontOperands, num_k_heads: int, head_k_dim: int) -> tuple[int, int]:
    """(channel groups, threads): a block per q/k head, v channels in blocks, one g/beta block."""
    threads = rt.block_size(head_k_dim)
    value_channels = ops.num_v_heads * ops.value_dim
    return 2 * num_k_heads + -(-value_channels // threads) + 1, threads


def gdn_decode_front(
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    num_k_heads: int,
    head_k_dim: int,
) -> DecodeFront:
    """See `reference.gdn_decode_front`."""
    kw = {"num_k_heads": num_k_heads, "head_k_dim": head_k_dim}
    ops = front_operands(qkv, a, b, conv_weight, a_log, dt_bias, conv_state, state_slots, **kw)
    num_seqs = qkv.shape[0]
    if num_seqs == 0:
        return ops.out
    device = qkv.device
    kernel = rt.get_kernel(OP, front_instance(OP, ops, conv_state), device)
    groups, threads = front_grid(ops, num_k_heads, head_k_dim)
    args = front_args(ops, conv_state, width=None, **kw)
    rt.launch(kernel, (groups, num_seqs), (threads,), args, device)
    return ops.out
