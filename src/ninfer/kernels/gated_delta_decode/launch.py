"""CUDA launcher of the batched gated-delta decode step (grid: value-column tiles x heads x rows).

Imports torch and kernels.runtime. Same signature and results as the twin in `reference.py`.
q, k and v may be strided along the batch (they are views into the fused qkv projection); each
row's [heads, dim] block must be contiguous. Key dims 16, 32, 64 and 128 are instantiated.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt

OP = "gated_delta_decode"
KEY_DIMS = (16, 32, 64, 128)


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """Keep a batch-strided view when each row is dense; otherwise copy."""
    if t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]:
        return t
    return t.contiguous()


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """See `reference.gated_delta_rule_decode`."""
    device = rt.check_cuda(q, k, v, g, beta, ssm_state, state_slots)
    num_seqs, num_k_heads, key_dim = q.shape
    _, num_v_heads, key_dim_s, value_dim = ssm_state.shape
    if key_dim not in KEY_DIMS or key_dim_s != key_dim:
        raise rt.KernelInputError(f"key dim {key_dim} (state {key_dim_s}) not in {KEY_DIMS}")
    if k.shape != q.shape or v.shape != (num_seqs, num_v_heads, value_dim):
        raise rt.KernelInputError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match the state"
        )
    head_shape = (num_seqs, num_v_heads)
    if num_v_heads % num_k_heads or g.shape != head_shape or beta.shape != head_shape:
        raise rt.KernelInputError("g and beta must be [B, Hv] with Hv a multiple of Hk")
    if ssm_state.dtype != torch.float32 or not ssm_state.is_contiguous():
        raise rt.KernelInputError("ssm_state must be a contiguous float32 tensor")
    if k.dtype != q.dtype:
        k = k.to(q.dtype)
    q, k, v = _rows_contiguous(q), _rows_contiguous(k), _rows_contiguous(v)
    g = g.float().contiguous()
    beta = beta.float().contiguous()
    slots = state_slots.to(torch.int64).contiguous()
    out = torch.empty((num_seqs, num_v_heads, value_dim), dtype=torch.float32, device=device)
    if num_seqs == 0:
        return out
    instance = f"gated_delta_decode<{rt.cuda_type(q, 'q')}, {rt.cuda_type(v, 'v')}, {key_dim}>"
    kernel = rt.get_kernel(OP, instance, device)
    args = (
        rt.ptr(out),
        rt.ptr(ssm_state),
        rt.ptr(q),
        rt.ptr(k),
        rt.ptr(v),
        rt.ptr(g),
        rt.ptr(beta),
        rt.ptr(slots),
        rt.i32(num_k_heads),
        rt.i32(num_v_heads),
        rt.i32(value_dim),
        rt.i64(q.stride(0)),
        rt.i64(k.stride(0)),
        rt.i64(v.stride(0)),
        rt.f32(scale),
    )
    grid = (-(-value_dim // 32), num_v_heads, num_seqs)
    rt.launch(kernel, grid, (32, 4), args, device)
    return out
