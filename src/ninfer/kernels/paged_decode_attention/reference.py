"""Torch twin of the paged decode-attention kernel.

Imports only torch. Written from the definition (softmax(q.k * scale) . v over each sequence's
first kv_len cached positions, query head h reading KV head h // (Hq / Hk)), one sequence at a
time with a host read of its length: a reference for tests, never a graph-captured path (the
model keeps its own `paged_attention` wherever the kernel does not run).
"""

from __future__ import annotations

import torch


def paged_decode_attention(
    q: torch.Tensor,
    k_pages: torch.Tensor,
    v_pages: torch.Tensor,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """Attention of one new query token per sequence over its paged KV (already stored).

    Args:
        q: [B, Hq, D]; k_pages, v_pages: [num_pages, P, Hk, D]; page_table: [B, max_pages];
        kv_lens: [B] tokens in each sequence's KV, the new one included.
    Returns:
        [B, Hq, D] in q's dtype.
    """
    num_seqs, num_q_heads, _ = q.shape
    page_size, num_kv_heads = k_pages.shape[1], k_pages.shape[2]
    group = num_q_heads // num_kv_heads
    out = torch.empty_like(q)
    for b in range(num_seqs):
        pos = torch.arange(int(kv_lens[b]), device=q.device)
        pages = page_table[b, pos // page_size].long()
        k = k_pages[pages, pos % page_size].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v_pages[pages, pos % page_size].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[b].float(), k) * scale
        out[b] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v).to(q.dtype)
    return out
