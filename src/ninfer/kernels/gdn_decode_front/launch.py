"""CUDA launcher of the Gated DeltaNet decode front (grid: channel groups x rows).

Imports torch, kernels.runtime and the twin's result type. Same signature and results as
`reference.gdn_decode_front`. qkv, a and b may be column slices of one fused projection output
(rows strided, columns dense), so the merged in_proj GEMM's result is read in place.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.gdn_decode_front.reference import L2_EPS, DecodeFront

OP = "gdn_decode_front"


def _dense_rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 2 and t.stride(1) == 1 else t.contiguous()


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
    device = rt.check_cuda(qkv, a, b, conv_weight, a_log, dt_bias, conv_state, state_slots)
    num_seqs, num_channels = qkv.shape
    num_v_heads = a.shape[-1]
    taps = conv_weight.shape[1]
    value_channels = num_channels - 2 * num_k_heads * head_k_dim
    if value_channels <= 0 or value_channels % num_v_heads:
        raise rt.KernelInputError(f"{num_channels} qkv channels do not split into q, k and v")
    if a.shape != (num_seqs, num_v_heads) or b.shape != a.shape:
        raise rt.KernelInputError(f"a {tuple(a.shape)} and b {tuple(b.shape)} must be [B, Hv]")
    if conv_weight.shape != (num_channels, taps) or taps < 2:
        raise rt.KernelInputError(f"conv weight {tuple(conv_weight.shape)} != [C, K >= 2]")
    if conv_state.shape[1:] != (num_channels, taps - 1) or not conv_state.is_contiguous():
        raise rt.KernelInputError("conv_state must be a contiguous [S, C, K-1] tensor")
    if head_k_dim > 1024 or b.dtype != qkv.dtype or a.dtype != qkv.dtype:
        raise rt.KernelInputError("a, b and qkv must share a dtype; head_k_dim at most 1024")
    qkv, a, b = _dense_rows(qkv), _dense_rows(a), _dense_rows(b)
    conv_weight = conv_weight.contiguous()
    a_log = a_log.float().contiguous()
    dt_bias = dt_bias.float().contiguous()
    slots = state_slots.to(torch.int64).contiguous()
    value_dim = value_channels // num_v_heads
    q = torch.empty((num_seqs, num_k_heads, head_k_dim), dtype=torch.float32, device=device)
    k = torch.empty_like(q)
    v = torch.empty((num_seqs, num_v_heads, value_dim), dtype=qkv.dtype, device=device)
    g = torch.empty((num_seqs, num_v_heads), dtype=torch.float32, device=device)
    beta = torch.empty_like(g)
    if num_seqs == 0:
        return DecodeFront(q, k, v, g, beta)
    types = ", ".join(
        rt.cuda_type(t, name)
        for t, name in ((qkv, "qkv"), (conv_state, "conv_state"), (conv_weight, "conv_weight"))
    )
    kernel = rt.get_kernel(OP, f"gdn_decode_front<{types}>", device)
    threads = rt.block_size(head_k_dim)
    num_groups = 2 * num_k_heads + -(-value_channels // threads) + 1
    args = (
        rt.ptr(q),
        rt.ptr(k),
        rt.ptr(v),
        rt.ptr(g),
        rt.ptr(beta),
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
        rt.ptr(slots),
        rt.i32(num_k_heads),
        rt.i32(head_k_dim),
        rt.i32(num_v_heads),
        rt.i32(value_dim),
        rt.i32(taps),
        rt.f32(L2_EPS),
    )
    rt.launch(kernel, (num_groups, num_seqs), (threads,), args, device)
    return DecodeFront(q, k, v, g, beta)
