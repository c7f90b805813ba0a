"""Torch twin of the attention-metadata kernel: which KV slot each new token writes.

Imports only torch. These are the ops `model.layers.gated_attention.build_attention_metadata`
ran before the kernel existed (a dozen launches a forward: searchsorted, gathers, integer
arithmetic); the CPU path still runs them, and the GPU tests hold the kernel bit-equal to them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class Indices(NamedTuple):
    """Per-token and per-sequence indices of one step (int64, on the inputs' device)."""

    slot_mapping: torch.Tensor  # [T] flat KV slot (page * P + offset) of each new token
    seq_idx: torch.Tensor  # [T] sequence of each token
    local_idx: torch.Tensor  # [T] index of each token within its sequence's new tokens
    kv_lens: torch.Tensor  # [B] num_computed + new tokens
    page_table: torch.Tensor  # [B, W] the page table as int64 (the input itself if it is)


def attention_indices(
    cu_seqlens: torch.Tensor,
    num_computed: torch.Tensor,
    page_table: torch.Tensor,
    page_size: int,
    num_tokens: int,
) -> Indices:
    """Token t of sequence b = seq_idx[t] (cu_seqlens[b] <= t < cu_seqlens[b + 1]) sits at KV
    index num_computed[b] + t - cu_seqlens[b], in page page_table[b, kv // page_size].

    Args:
        cu_seqlens: [B + 1] int32 or int64; num_computed: [B] int64; page_table: [B, W] int32 or
        int64 whose pages cover every new token's KV index.
    """
    device = num_computed.device
    cu = cu_seqlens.to(torch.int64)
    token = torch.arange(num_tokens, dtype=torch.int64, device=device)
    seq_idx = torch.searchsorted(cu[1:], token, right=True)  # [T]
    local_idx = token - cu[seq_idx]
    kv_idx = num_computed[seq_idx] + local_idx  # [T] position in the sequence's KV
    table = page_table.to(torch.int64)
    page = table[seq_idx, kv_idx // page_size]
    return Indices(
        slot_mapping=page * page_size + kv_idx % page_size,
        seq_idx=seq_idx,
        local_idx=local_idx,
        kv_lens=num_computed + (cu[1:] - cu[:-1]),
        page_table=table,
    )
