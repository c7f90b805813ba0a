"""CUDA launcher of the split-KV paged decode attention (a partial and a combine launch).

Imports torch and kernels.runtime. Same results as `reference.paged_decode_attention` where
`supports` says yes. The split size depends only on the page table's width (a host fact), never
on the lengths on the device, so a graph captured for one width replays for any lengths in it.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt

OP = "paged_decode_attention"
WARPS = 4  # splits per block of the partial launch
MAX_REGS_PER_LANE = 64  # G query heads x D/32 dims of accumulator per lane (no spills at 64)


def supports(q: torch.Tensor, k_pages: torch.Tensor) -> bool:
    """Whether the kernel takes these shapes (head dim a multiple of 32, modest groups)."""
    if q.dim() != 3 or k_pages.dim() != 4 or q.dtype not in rt.CUDA_TYPES:
        return False
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_pages.shape[2]
    return (
        k_pages.dtype == q.dtype
        and k_pages.shape[3] == head_dim
        and head_dim % 32 == 0
        and num_q_heads % num_kv_heads == 0
        and (num_q_heads // num_kv_heads) * (head_dim // 32) <= MAX_REGS_PER_LANE
    )


def split_tokens(capacity: int) -> int:
    """KV positions per split: 16 up to 8k of table width, then growing to keep <= 512 splits."""
    size = 16
    while size * 512 < capacity:
        size *= 2
    return size


def paged_decode_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """See `reference.paged_decode_attention`."""
    device = rt.check_cuda(q, k_pages, v_pages, page_table, kv_lens)
    if not supports(q, k_pages) or v_pages.shape != k_pages.shape or v_pages.dtype != q.dtype:
        raise rt.KernelInputError(
            f"paged decode attention does not take q {tuple(q.shape)} {q.dtype} with pages "
            f"{tuple(k_pages.shape)} {k_pages.dtype}"
        )
    if not (k_pages.is_contiguous() and v_pages.is_contiguous()):
        raise rt.KernelInputError("KV pages must be contiguous")
    num_seqs, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = k_pages.shape[1], k_pages.shape[2]
    group = num_q_heads // num_kv_heads
    q = q.contiguous()
    table = page_table.to(torch.int64).contiguous()
    lens = kv_lens.to(torch.int64).contiguous()
    capacity = table.shape[1] * page_size
    tokens_per_split = split_tokens(capacity)
    num_splits = -(-capacity // tokens_per_split)
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    ws_acc = torch.empty(
        (num_seqs, num_q_heads, num_splits, head_dim), dtype=torch.float32, device=device
    )
    ws_ml = torch.empty((num_seqs, num_q_heads, num_splits, 2), dtype=torch.float32, device=device)
    dtype = rt.cuda_type(q, "q")
    partial = rt.get_kernel(OP, f"paged_decode_partial<{dtype}, {head_dim}, {group}>", device)
    args = (
        rt.ptr(ws_acc),
        rt.ptr(ws_ml),
        rt.ptr(q),
        rt.ptr(k_pages),
        rt.ptr(v_pages),
        rt.ptr(table),
        rt.ptr(lens),
        rt.i32(num_kv_heads),
        rt.i32(page_size),
        rt.i32(table.shape[1]),
        rt.i32(num_splits),
        rt.i32(tokens_per_split),
        rt.f32(scale),
    )
    grid = (-(-num_splits // WARPS), num_kv_heads, num_seqs)
    rt.launch(partial, grid, (32 * WARPS,), args, device)
    combine = rt.get_kernel(OP, f"paged_decode_combine<{dtype}>", device)
    args = (rt.ptr(out), rt.ptr(ws_acc), rt.ptr(ws_ml), rt.i32(num_splits), rt.i32(head_dim))
    rt.launch(combine, (num_q_heads, num_seqs), (rt.block_size(head_dim),), args, device)
    return out
