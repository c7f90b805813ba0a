"""CUDA launcher of the fused q/k RMSNorm + RoPE: a warp per (token, head) where the head dim
is 32 x E and rotate-half pairs stay on one lane slot, else a block per (token, head).

Imports torch and kernels.runtime. Same signature and results as `reference.qk_norm_rope` where
`supports` says yes; q and k are read through their strides (views into the fused projection).
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt

OP = "qk_norm_rope"
MAX_TOKENS = 65535  # tokens ride grid.y


def supports(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor) -> bool:
    """Same dtype, head dim <= 1024 with unit stride, an even rotary width <= head dim, and at
    most MAX_TOKENS tokens (the twin runs for longer prefill chunks)."""
    head_dim = q.shape[-1]
    rotary = cos.shape[-1]
    return (
        q.dim() == 3
        and k.dim() == 3
        and q.shape[0] <= MAX_TOKENS
        and k.shape[-1] == head_dim
        and q.dtype == k.dtype
        and q.dtype in rt.CUDA_TYPES
        and head_dim <= 1024
        and q.stride(-1) == 1
        and k.stride(-1) == 1
        and rotary % 2 == 0
        and rotary <= head_dim
        and cos.dtype == torch.float32
    )


WARP_DIMS = (1, 2, 4, 8, 16)  # E = head dim / 32 of the warp kernel
ROWS_PER_BLOCK = 8  # warps (head rows) per block of the warp kernel


def per_warp_dims(head_dim: int, rotary: int) -> int | None:
    """E of `qk_norm_rope_warp` for this shape, or None (the block kernel serves it)."""
    if head_dim % 32 or head_dim // 32 not in WARP_DIMS:
        return None
    dims = head_dim // 32
    return dims if (rotary // 2) % dims == 0 else None


def _prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    device: torch.device,
) -> tuple[torch.Tensor, ...]:
    """Both launchers' outputs (q_out, k_out: dense [T, H, D]) and kernel-ready operands (norm
    weights in q's dtype, dense cos / sin)."""
    q_out = torch.empty(q.shape, dtype=q.dtype, device=device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=device)
    q_weight = q_weight.to(q.dtype).contiguous()
    k_weight = k_weight.to(q.dtype).contiguous()
    return q_out, k_out, q_weight, k_weight, cos.contiguous(), sin.contiguous()


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    *,
    per_warp: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """See `reference.qk_norm_rope`; `per_warp` False keeps the block kernel (tests compare)."""
    device = rt.check_cuda(q, k, q_weight, k_weight, cos, sin)
    if not supports(q, k, cos):
        raise rt.KernelInputError(
            f"qk_norm_rope does not take q {tuple(q.shape)}, k {tuple(k.shape)}, "
            f"rotary width {cos.shape[-1]}"
        )
    num_tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    q_out, k_out, q_weight, k_weight, cos, sin = _prepare(
        q, k, q_weight, k_weight, cos, sin, device
    )
    if num_tokens == 0:
        return q_out, k_out
    dims = per_warp_dims(head_dim, cos.shape[-1]) if per_warp else None
    common = (  # the arguments both kernels start with
        rt.ptr(q_out),
        rt.ptr(k_out),
        rt.ptr(q),
        rt.i64(q.stride(0)),
        rt.i64(q.stride(1)),
        rt.ptr(k),
        rt.i64(k.stride(0)),
        rt.i64(k.stride(1)),
        rt.ptr(q_weight),
        rt.ptr(k_weight),
        rt.ptr(cos),
        rt.ptr(sin),
        rt.i32(num_q_heads),
        rt.i32(num_k_heads),
    )
    dtype = rt.cuda_type(q, "q")
    rows = num_q_heads + num_k_heads
    if dims is not None:
        kernel = rt.get_kernel(OP, f"qk_norm_rope_warp<{dtype}, {dims}>", device)
        args = (*common, rt.i32(cos.shape[-1]), rt.f32(eps))
        grid = (-(-rows // ROWS_PER_BLOCK), num_tokens)
        rt.launch(kernel, grid, (32 * ROWS_PER_BLOCK,), args, device)
    else:
        kernel = rt.get_kernel(OP, f"qk_norm_rope<{dtype}>", device)
        args = (*common, rt.i32(head_dim), rt.i32(cos.shape[-1]), rt.f32(eps))
        rt.launch(kernel, (rows, num_tokens), (rt.block_size(head_dim),), args, device)
    return q_out, k_out


def store_problem(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> str | None:
    """Why `qk_norm_rope_store` cannot take these operands, or None when it can: the warp
    kernel's shapes (`supports`, `per_warp_dims`), v shaped as k with unit dim stride, plain
    contiguous pages [pages, P, Hk, D] in q's dtype, and one int64 slot per token."""
    if not supports(q, k, cos) or per_warp_dims(q.shape[-1], cos.shape[-1]) is None:
        return "the warp kernel does not take these q / k shapes"
    if v.shape != k.shape or v.stride(-1) != 1 or v.dtype != k.dtype:
        return f"v {tuple(v.shape)} {v.dtype} does not match k {tuple(k.shape)} {k.dtype}"
    for name, pages in (("k", k_pages), ("v", v_pages)):
        if (
            not isinstance(pages, torch.Tensor)
            or pages.dim() != 4
            or tuple(pages.shape[2:]) != tuple(k.shape[1:])
            or pages.dtype != q.dtype
            or not pages.is_contiguous()
        ):
            return f"{name} pages must be plain contiguous [pages, P, {k.shape[1]}, {k.shape[2]}]"
    if (
        slot_mapping.dtype != torch.int64
        or slot_mapping.shape != (q.shape[0],)
        or not slot_mapping.is_contiguous()
    ):
        return f"slot_mapping must be int64 [{q.shape[0]}], got {slot_mapping.dtype}"
    return None


def qk_norm_rope_store(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`qk_norm_rope` and the KV store of plain pages (k's result and v into their slots) in one
    launch; see `reference.qk_norm_rope_store`."""
    device = rt.check_cuda(q, k, v, q_weight, k_weight, cos, sin, k_pages, v_pages, slot_mapping)
    if (problem := store_problem(q, k, v, cos, k_pages, v_pages, slot_mapping)) is not None:
        raise rt.KernelInputError(f"qk_norm_rope_store: {problem}")
    num_tokens, num_q_heads, head_dim = q.shape
    num_k_heads = k.shape[1]
    q_out, k_out, q_weight, k_weight, cos, sin = _prepare(
        q, k, q_weight, k_weight, cos, sin, device
    )
    if num_tokens == 0:
        return q_out, k_out
    dims = per_warp_dims(head_dim, cos.shape[-1])
    kernel = rt.get_kernel(OP, f"qk_norm_rope_store<{rt.cuda_type(q, 'q')}, {dims}>", device)
    args = (
        rt.ptr(q_out),
        rt.ptr(k_out),
        rt.ptr(k_pages),
        rt.ptr(v_pages),
        rt.ptr(q),
        rt.i64(q.stride(0)),
        rt.i64(q.stride(1)),
        rt.ptr(k),
        rt.i64(k.stride(0)),
        rt.i64(k.stride(1)),
        rt.ptr(v),
        rt.i64(v.stride(0)),
        rt.i64(v.stride(1)),
        rt.ptr(slot_mapping),
        rt.ptr(q_weight),
        rt.ptr(k_weight),
        rt.ptr(cos),
        rt.ptr(sin),
        rt.i32(num_q_heads),
        rt.i32(num_k_heads),
        rt.i32(cos.shape[-1]),
        rt.f32(eps),
    )
    rows = num_q_heads + 2 * num_k_heads
    grid = (-(-rows // ROWS_PER_BLOCK), num_tokens)
    rt.launch(kernel, grid, (32 * ROWS_PER_BLOCK,), args, device)
    return q_out, k_out
