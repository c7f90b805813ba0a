"""CUDA launcher of the attention-metadata kernel: `reference.attention_indices` in one launch.

Imports torch and kernels.runtime. `problem` names what the kernel does not take (dispatch then
runs the torch twin); the results are the twin's, bit for bit (integer arithmetic only).
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.attention_metadata.reference import Indices

OP = "attention_metadata"
THREADS = 128
MAX_BLOCKS = 64  # grid-stride beyond: a prefill chunk's tokens need no more than a few passes
_INT_TYPES = {torch.int32: "int", torch.int64: "long long"}


def problem(
    cu_seqlens: torch.Tensor,
    num_computed: torch.Tensor,
    page_table: torch.Tensor,
    num_tokens: int,
) -> str | None:
    """Why the kernel cannot take these operands, or None."""
    if cu_seqlens.dtype not in _INT_TYPES or page_table.dtype not in _INT_TYPES:
        return "cu_seqlens and the page table must be int32 or int64"
    if num_computed.dtype != torch.int64:
        return f"num_computed must be int64, got {num_computed.dtype}"
    if cu_seqlens.dim() != 1 or num_computed.dim() != 1 or page_table.dim() != 2:
        return "cu_seqlens [B + 1], num_computed [B] and a 2-D page table"
    num_seqs = num_computed.shape[0]
    if cu_seqlens.shape[0] != num_seqs + 1 or page_table.shape[0] != num_seqs or num_seqs < 1:
        return f"cu_seqlens {tuple(cu_seqlens.shape)} and the table do not match {num_seqs} rows"
    if not cu_seqlens.is_contiguous():
        return "cu_seqlens must be contiguous"
    if page_table.shape[1] < 1 or page_table.stride(1) != 1:
        return "the page table's rows must be dense"
    if max(num_tokens, page_table.numel()) >= 2**31:
        return "more than 2**31 tokens or table entries"
    return None


def attention_indices(
    cu_seqlens: torch.Tensor,
    num_computed: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    num_tokens: int,
) -> Indices:
    """See `reference.attention_indices`."""
    device = rt.check_cuda(cu_seqlens, num_computed, page_table)
    if (why := problem(cu_seqlens, num_computed, page_table, num_tokens)) is not None:
        raise rt.KernelInputError(why)
    num_seqs, width = page_table.shape
    per_token = torch.empty((3, num_tokens), dtype=torch.int64, device=device)
    kv_lens = torch.empty(num_seqs, dtype=torch.int64, device=device)
    widen = page_table.dtype != torch.int64
    table = torch.empty((num_seqs, width), dtype=torch.int64, device=device) if widen else None
    total = max(num_tokens, num_seqs, num_seqs * width if widen else 0)
    instance = f"attention_metadata<{_INT_TYPES[cu_seqlens.dtype]}, {_INT_TYPES[page_table.dtype]}>"
    kernel = rt.get_kernel(OP, instance, device)
    args = (
        rt.ptr(per_token[0]),
        rt.ptr(per_token[1]),
        rt.ptr(per_token[2]),
        rt.ptr(kv_lens),
        rt.ptr(table),
        rt.ptr(cu_seqlens),
        rt.ptr(num_computed),
        rt.i64(num_computed.stride(0)),
        rt.ptr(page_table),
        rt.i64(page_table.stride(0)),
        rt.i32(width),
        rt.i32(num_seqs),
        rt.i32(num_tokens),
        rt.i32(page_size),
    )
    blocks = max(1, min(MAX_BLOCKS, -(-total // THREADS)))
    rt.launch(kernel, (blocks,), (THREADS,), args, device)
    return Indices(
        slot_mapping=per_token[0],
        seq_idx=per_token[1],
        local_idx=per_token[2],
        kv_lens=kv_lens,
        page_table=page_table if table is None else table,
    )
