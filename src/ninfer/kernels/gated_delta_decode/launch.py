"""CUDA launcher of the batched gated-delta decode step (grid: value-column tiles x heads x rows).

Imports torch and kernels.runtime. Same signature and results as the twin in `reference.py`.
q, k and v may be strided along the batch (they are views into the fused qkv projection); each
row's [heads, dim] block must be contiguous. Key dims 16, 32, 64 and 128 are instantiated.
Two kernels compute the same step: the narrow one (32 value columns per block, 4-byte state loads)
covers the SMs at small batches, the wide one (128 columns per block, 16-byte loads) streams the
state faster once there are enough (row, head) blocks to fill the machine.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt

OP = "gated_delta_decode"
KEY_DIMS = (16, 32, 64, 128)
WIDE_COLUMNS = 128  # value columns per block of the wide kernel
WIDE_MIN_BLOCKS = 528  # wide blocks that keep an H200's 132 SMs busy (4 per SM)


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
    variant: str = "auto",
) -> torch.Tensor:
    """See `reference.gated_delta_rule_decode`; `variant` "narrow" / "wide" forces a kernel."""
    device = rt.check_cuda(q, k, v, g, beta, ssm_state, state_slots)
    q, k, v, g, beta = delta_operands(q, k, v, g, beta, ssm_state)
    num_seqs, _, key_dim = q.shape
    _, num_v_heads, _, value_dim = ssm_state.shape
    slots = state_slots.to(torch.int64).contiguous()
    out = torch.empty((num_seqs, num_v_heads, value_dim), dtype=torch.float32, device=device)
    if num_seqs == 0:
        return out
    wide = use_wide_kernel(variant, num_seqs, num_v_heads, value_dim, ssm_state, out)
    name = "gated_delta_decode_wide" if wide else "gated_delta_decode"
    instance = f"{name}<{rt.cuda_type(q, 'q')}, {rt.cuda_type(v, 'v')}, {key_dim}>"
    kernel = rt.get_kernel(OP, instance, device)
    args = delta_args(out, ssm_state, (q, k, v, g, beta), slots, width=None, scale=scale)
    if wide:
        rt.launch(kernel, (value_dim // WIDE_COLUMNS, num_v_heads, num_seqs), (32, 8), args, device)
    else:
        rt.launch(kernel, (-(-value_dim // 32), num_v_heads, num_seqs), (32, 4), args, device)
    return out


def delta_operands(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """Check one delta-rule step per row (q, k [rows, Hk, Dk], v [rows, Hv, Dv], g, beta
    [rows, Hv]) against the state and return them kernel-ready (rows may stay batch-strided);
    the verify kernel (kernels/gated_delta_verify) shares it."""
    num_rows, num_k_heads, key_dim = q.shape
    _, num_v_heads, key_dim_s, value_dim = ssm_state.shape
    if key_dim not in KEY_DIMS or key_dim_s != key_dim:
        raise rt.KernelInputError(f"key dim {key_dim} (state {key_dim_s}) not in {KEY_DIMS}")
    if k.shape != q.shape or v.shape != (num_rows, num_v_heads, value_dim):
        raise rt.KernelInputError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match the state"
        )
    head_shape = (num_rows, num_v_heads)
    if num_v_heads % num_k_heads or g.shape != head_shape or beta.shape != head_shape:
        raise rt.KernelInputError("g and beta must be [B, Hv] with Hv a multiple of Hk")
    if ssm_state.dtype != torch.float32 or not ssm_state.is_contiguous():
        raise rt.KernelInputError("ssm_state must be a contiguous float32 tensor")
    if k.dtype != q.dtype:
        k = k.to(q.dtype)
    q, k, v = _rows_contiguous(q), _rows_contiguous(k), _rows_contiguous(v)
    return q, k, v, g.float().contiguous(), beta.float().contiguous()


def delta_args(
    out: torch.Tensor,
    ssm_state: torch.Tensor,
    operands: tuple[torch.Tensor, ...],
    slots: torch.Tensor,
    *,
    width: int | None,
    scale: float,
) -> tuple:
    """The kernel arguments of a decode step (`width` None) or of the W-column verify
    (kernels/gated_delta_verify); `operands` as `delta_operands` returns them."""
    q, k, v, g, beta = operands
    return (
        rt.ptr(out),
        rt.ptr(ssm_state),
        *(rt.ptr(t) for t in operands),
        rt.ptr(slots),
        *(() if width is None else (rt.i32(width),)),
        rt.i32(q.shape[1]),
        rt.i32(ssm_state.shape[1]),
        rt.i32(ssm_state.shape[3]),
        rt.i64(q.stride(0)),
        rt.i64(k.stride(0)),
        rt.i64(v.stride(0)),
        rt.f32(scale),
    )


def use_wide_kernel(
    variant: str, num_seqs: int, num_v_heads: int, value_dim: int, *tensors: torch.Tensor
) -> bool:
    """Whether the wide kernel runs: it needs 128-column tiles and 16-byte aligned rows."""
    if variant not in ("auto", "narrow", "wide"):
        raise rt.KernelInputError(f"unknown variant {variant!r}")
    fits = value_dim % WIDE_COLUMNS == 0 and all(t.data_ptr() % 16 == 0 for t in tensors)
    if variant == "wide" and not fits:
        raise rt.KernelInputError(f"the wide kernel needs a value dim multiple of {WIDE_COLUMNS}")
    if variant != "auto":
        return variant == "wide"
    blocks = num_seqs * num_v_heads * (value_dim // WIDE_COLUMNS)
    return fits and blocks >= WIDE_MIN_BLOCKS
