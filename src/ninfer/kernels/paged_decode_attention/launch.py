"""CUDA launcher of the split-KV paged decode attention (a partial and a combine launch).

Imports torch and kernels.runtime. Same results as `reference.paged_decode_attention` where
`supports` says yes. The split plan depends only on host facts (batch, KV heads, group and the page
table's width), never on the lengths on the device, so a graph captured for one width replays for
any lengths in it; the kernels read the lengths themselves and skip splits past them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ninfer.kernels import runtime as rt

OP = "paged_decode_attention"
WARPS = 4  # warps per block of the partial launch
MAX_REGS_PER_LANE = 64  # G query heads x D/32 dims of accumulator per lane (no spills at 64)
MAX_HEAD_DIM = 512  # a lane holds D/32 dims of each row it loads
MAX_GROUP = 16  # query heads per KV head (the reduce over SUB x G scores stays in registers)
MIN_SPLIT_TOKENS = 32  # one chunk of 8 tokens per warp
MAX_BLOCKS = 2048  # partial blocks over the table's capacity: ~15 per SM on an H200's 132
SCORE_FLOATS = 8192  # shared-memory scores per block (32 KiB): G x tokens_per_split
COMBINE_DIMS = 32  # head dims per combine block


class SplitPlan(NamedTuple):
    """How the KV positions of the page table's capacity are cut into partial blocks."""

    tokens_per_split: int
    num_splits: int


def supports(q: torch.Tensor, k_pages: torch.Tensor) -> bool:
    """Whether the kernel takes these shapes (head dim a multiple of 32 to 512, modest groups)."""
    if q.dim() != 3 or k_pages.dim() != 4 or q.dtype not in rt.CUDA_TYPES:
        return False
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_pages.shape[2]
    if num_kv_heads == 0 or num_q_heads % num_kv_heads:
        return False
    group = num_q_heads // num_kv_heads
    return (
        k_pages.dtype == q.dtype
        and k_pages.shape[3] == head_dim
        and head_dim % 32 == 0
        and head_dim <= MAX_HEAD_DIM
        and group <= MAX_GROUP
        and group * (head_dim // 32) <= MAX_REGS_PER_LANE
        and k_pages.data_ptr() % 16 == 0
    )


def plan_splits(num_seqs: int, num_kv_heads: int, group: int, capacity: int) -> SplitPlan:
    """Tokens per split: the smallest power of two >= 32 with at most MAX_BLOCKS partial blocks.

    Small splits keep short contexts spread over the SMs (1k tokens, batch 1, 4 KV heads: 32
    splits of 32 tokens = 128 blocks); long ones grow the split so the combine stays cheap (a 32k
    table: 256 splits of 128). Bounded by the block's shared memory for G x split scores.
    """
    max_tokens = MIN_SPLIT_TOKENS
    while max_tokens * 2 * group <= SCORE_FLOATS:
        max_tokens *= 2
    capacity = max(capacity, 1)
    size = MIN_SPLIT_TOKENS
    while size < max_tokens and num_seqs * num_kv_heads * -(-capacity // size) > MAX_BLOCKS:
        size *= 2
    return SplitPlan(size, -(-capacity // size))


def partial_smem_bytes(group: int, head_dim: int, tokens_per_split: int) -> int:
    """The partial block's dynamic shared memory: the scores, later the warps' accumulators."""
    return 4 * max(group * tokens_per_split, WARPS * group * head_dim)


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
    if v_pages.data_ptr() % 16:
        raise rt.KernelInputError("V pages must start on a 16-byte boundary")
    num_seqs, num_q_heads, head_dim = q.shape
    page_size, num_kv_heads = k_pages.shape[1], k_pages.shape[2]
    group = num_q_heads // num_kv_heads
    q = q.contiguous()
    if q.data_ptr() % 16:
        q = q.clone()  # the kernel loads q rows as 16-byte vectors
    # the graphs pass the table as a column slice of a wider buffer: read it with its row stride
    table = page_table if page_table.dtype == torch.int64 else page_table.to(torch.int64)
    if table.dim() != 2 or table.shape[0] != num_seqs:
        raise rt.KernelInputError(f"page table {tuple(table.shape)} is not [{num_seqs}, width]")
    if table.stride(1) != 1:
        table = table.contiguous()
    lens = kv_lens.to(torch.int64).contiguous()
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    table_width = table.shape[1]
    plan = plan_splits(num_seqs, num_kv_heads, group, table_width * page_size)
    ws_acc = torch.empty(
        (num_seqs, num_q_heads, plan.num_splits, head_dim), dtype=torch.float32, device=device
    )
    ws_ml = torch.empty(
        (num_seqs, num_q_heads, plan.num_splits, 2), dtype=torch.float32, device=device
    )
    dtype = rt.cuda_type(q, "q")
    partial = rt.get_kernel(OP, f"paged_decode_partial<{dtype}, {head_dim}, {group}>", device)
    args = (
        rt.ptr(ws_acc),
        rt.ptr(ws_ml),
        rt.ptr(q),
        rt.ptr(k_pages),
        rt.ptr(v_pages),
        rt.ptr(table),
        rt.i64(table.stride(0)),
        rt.ptr(lens),
        rt.i32(num_kv_heads),
        rt.i32(page_size),
        rt.i32(table_width),
        rt.i32(plan.num_splits),
        rt.i32(plan.tokens_per_split),
        rt.f32(scale),
    )
    grid = (plan.num_splits, num_kv_heads, num_seqs)
    smem = partial_smem_bytes(group, head_dim, plan.tokens_per_split)
    rt.launch(partial, grid, (32 * WARPS,), args, device, shared_mem=smem)
    combine = rt.get_kernel(OP, f"paged_decode_combine<{dtype}>", device)
    args = (
        rt.ptr(out),
        rt.ptr(ws_acc),
        rt.ptr(ws_ml),
        rt.ptr(lens),
        rt.i32(plan.num_splits),
        rt.i32(plan.tokens_per_split),
        rt.i32(table_width),
        rt.i32(page_size),
        rt.i32(head_dim),
    )
    grid = (num_q_heads, num_seqs, head_dim // COMBINE_DIMS)
    rt.launch(combine, grid, (256,), args, device)
    return out
