"""Torch twin of the paged decode-attention kernel.

Imports torch and the KV formats (kernels/kv_quant). Written from the definition (softmax(q.k *
scale) . v over each sequence's first kv_len cached positions, query head h reading KV head
h // (Hq / Hk)), one sequence at a time with a host read of its length: a reference for tests,
never a graph-captured path (the model keeps its own `paged_attention` wherever the kernel does
not run). Quantized pages are dequantized to fp32 by the store's own twin, so the kernel's
in-register dequantization is checked against it.
"""

from __future__ import annotations

import torch

from ninfer.kernels.kv_quant.formats import KvPages
from ninfer.kernels.kv_quant.reference import read_pages


def paged_decode_attention(
    q: torch.Tensor,
    k_pages: KvPages,
    v_pages: KvPages,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """Attention of one new query token per sequence over its paged KV (already stored).

    Args:
        q: [B, Hq, D]; k_pages, v_pages: [num_pages, P, Hk, D] (plain or `QuantPages`);
        page_table: [B, max_pages];
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
        index = (pages, pos % page_size)
        k = read_pages(k_pages, index, torch.float32).repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = read_pages(v_pages, index, torch.float32).repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[b].float(), k) * scale
        out[b] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v).to(q.dtype)
    return out
