"""CUDA launcher of the fused gated-delta prefill (grid: value-column tiles x value heads x seqs).

Imports torch, kernels.runtime and the conv launcher's offsets helper. Same signature and results
as `reference.gated_delta_prefill`. q, k and v may be row-strided views into the conv output and
a, b column slices of the fused projection (each row's [heads, dim] block dense): all are read in
place. Key dims 16, 32, 64 and 128 are instantiated; any value dim runs (a partial last tile).
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.causal_conv1d.launch import device_cu_seqlens
from ninfer.kernels.gated_delta_prefill.reference import L2_EPS

OP = "gated_delta_prefill"
KEY_DIMS = (16, 32, 64, 128)
COLS_PER_BLOCK = 16  # GDP_COLS in gated_delta_prefill.cu
THREADS = 128  # GDP_THREADS
MAX_GRID_YZ = 65535


def _heads_dense(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[T, H, D] with each row's [H, D] block dense (any row stride); else a dense copy."""
    t = t.to(dtype)
    if t.stride(2) == 1 and t.stride(1) == t.shape[2]:
        return t
    return t.contiguous()


def _columns_dense(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    t = t.to(dtype)
    return t if t.stride(1) == 1 else t.contiguous()


def gated_delta_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    query_lens: tuple[int, ...],
    *,
    scale: float,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """See `reference.gated_delta_prefill`."""
    device = rt.check_cuda(q, k, v, a, b, a_log, dt_bias, ssm_state, state_slots)
    num_tokens, num_k_heads, key_dim = q.shape
    _, num_v_heads, key_dim_s, value_dim = ssm_state.shape
    num_seqs = len(query_lens)
    if key_dim not in KEY_DIMS or key_dim_s != key_dim:
        raise rt.KernelInputError(f"key dim {key_dim} (state {key_dim_s}) not in {KEY_DIMS}")
    if k.shape != q.shape or v.shape != (num_tokens, num_v_heads, value_dim):
        raise rt.KernelInputError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match the state"
        )
    gate_shape = (num_tokens, num_v_heads)
    if num_v_heads % num_k_heads or a.shape != gate_shape or b.shape != gate_shape:
        raise rt.KernelInputError("a and b must be [T, Hv] with Hv a multiple of Hk")
    if a_log.shape != (num_v_heads,) or dt_bias.shape != (num_v_heads,):
        raise rt.KernelInputError("A_log and dt_bias must be [Hv]")
    if ssm_state.dtype != torch.float32 or not ssm_state.is_contiguous():
        raise rt.KernelInputError("ssm_state must be a contiguous float32 tensor")
    if sum(query_lens) != num_tokens or state_slots.shape != (num_seqs,):
        raise rt.KernelInputError(
            f"query_lens {query_lens} and slots {tuple(state_slots.shape)} != {num_tokens} tokens"
        )
    if num_v_heads > MAX_GRID_YZ or num_seqs > MAX_GRID_YZ:
        raise rt.KernelInputError(f"{num_v_heads} heads x {num_seqs} sequences exceed the grid")
    dtype = q.dtype
    type_name = rt.cuda_type(q, "q")
    q, k, v = (_heads_dense(t, dtype) for t in (q, k, v))
    a, b = _columns_dense(a, dtype), _columns_dense(b, dtype)
    a_log = a_log.float().contiguous()
    dt_bias = dt_bias.float().contiguous()
    slots = state_slots.to(torch.int64).contiguous()
    offsets = device_cu_seqlens(query_lens, cu_seqlens, device)
    out = torch.empty((num_tokens, num_v_heads, value_dim), dtype=torch.float32, device=device)
    if num_seqs == 0 or value_dim == 0:
        return out
    kernel = rt.get_kernel(OP, f"gated_delta_prefill<{type_name}, {key_dim}>", device)
    args = (
        rt.ptr(out),
        rt.ptr(ssm_state),
        rt.ptr(q),
        rt.i64(q.stride(0)),
        rt.ptr(k),
        rt.i64(k.stride(0)),
        rt.ptr(v),
        rt.i64(v.stride(0)),
        rt.ptr(a),
        rt.i64(a.stride(0)),
        rt.ptr(b),
        rt.i64(b.stride(0)),
        rt.ptr(a_log),
        rt.ptr(dt_bias),
        rt.ptr(slots),
        rt.ptr(offsets),
        rt.i32(num_k_heads),
        rt.i32(num_v_heads),
        rt.i32(value_dim),
        rt.f32(scale),
        rt.f32(L2_EPS),
    )
    grid = (-(-value_dim // COLS_PER_BLOCK), num_v_heads, num_seqs)
    rt.launch(kernel, grid, (THREADS,), args, device)
    return out
