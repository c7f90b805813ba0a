"""ForwardBatch: plain data describing one model step (which tokens; where their KV and state live).

Imports only torch and model.errors; holds no policy. Device tensors are what kernels read; the
few Python ints beside them (`max_query_len`, `max_kv_len`, `query_lens`) let the torch reference
size its work without a device-to-host sync, and are what a CUDA graph would bake in as constants.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ninfer.model.errors import BatchError


@dataclass
class ForwardBatch:
    """One step: a prefill chunk (one or more sequences) or a decode batch (one token each).

    Token t of sequence b sits at flat index `cu_seqlens[b] + i` and at KV index
    `num_computed[b] + i` of that sequence; its KV goes to page `page_table[b, kv // P]`, offset
    `kv % P`. `positions` are RoPE positions: `[T]` for text, or `[3, T]` (t, h, w) for MRoPE.
    `embed_index` / `embed_rows` (media prompts only) replace the token embeddings at those flat
    indices by precomputed rows (vision-tower outputs); None costs nothing.
    """

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] or [3, T] int64
    cu_seqlens: torch.Tensor  # [B+1] int32/int64
    num_computed: torch.Tensor  # [B] int64, tokens already in KV / state
    page_table: torch.Tensor  # [B, max_pages] int32, padded with any valid page id
    state_slots: torch.Tensor  # [B] int64, state slot of each sequence
    query_lens: tuple[int, ...]  # host copy of cu_seqlens diffs (B entries)
    max_kv_len: int  # host bound on num_computed[b] + query_lens[b]
    embed_index: torch.Tensor | None = None  # [K] int64 flat token indices
    embed_rows: torch.Tensor | None = None  # [K, H] their input embeddings
    # A speculative verify step: every sequence feeds `verify_width` tokens, and the linear
    # layers leave the state slots untouched, recording each column's inputs instead
    # (`verify_states`, one `gated_deltanet.VerifyRecord` per linear layer in order) so the
    # engine can fold exactly the kept prefix into the state later (engine/spec_step.py).
    verify_width: int = 0
    verify_states: list[Any] | None = None
    # `max_kv_len` is a static bound, not the longest sequence (CUDA graphs of verify steps):
    # attention takes every length from `num_computed` on the device
    static_shapes: bool = False
    # (cos, sin) [T, R] fp32 of `positions`, when the caller has them already: a speculative
    # round's verify and head pass share their positions, and its draft steps take theirs from
    # one computation (`Rope.cos_sin`: the same values, three launches fewer a forward)
    rope_angles: tuple[torch.Tensor, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        num_tokens = self.input_ids.shape[0]
        num_seqs = len(self.query_lens)
        if self.input_ids.dim() != 1:
            raise BatchError(f"input_ids must be 1-D, got shape {tuple(self.input_ids.shape)}")
        if sum(self.query_lens) != num_tokens or min(self.query_lens, default=0) < 1:
            raise BatchError(
                f"query_lens {self.query_lens} must be >= 1 each and sum to {num_tokens} tokens"
            )
        if self.positions.shape[-1] != num_tokens or self.positions.dim() not in (1, 2):
            raise BatchError(f"positions shape {tuple(self.positions.shape)} != [T] or [3, T]")
        if self.positions.dim() == 2 and self.positions.shape[0] != 3:
            raise BatchError(f"MRoPE positions need 3 rows, got {self.positions.shape[0]}")
        if self.cu_seqlens.shape != (num_seqs + 1,):
            raise BatchError(f"cu_seqlens shape {tuple(self.cu_seqlens.shape)} != [{num_seqs + 1}]")
        for name in ("num_computed", "state_slots"):
            shape = tuple(getattr(self, name).shape)
            if shape != (num_seqs,):
                raise BatchError(f"{name} shape {shape} != [{num_seqs}]")
        if self.page_table.dim() != 2 or self.page_table.shape[0] != num_seqs:
            raise BatchError(f"page_table shape {tuple(self.page_table.shape)} != [{num_seqs}, *]")
        if self.verify_width and self.query_lens != (self.verify_width,) * num_seqs:
            raise BatchError(f"a verify step feeds {self.verify_width} tokens per sequence")
        if self.rope_angles is not None and any(
            a.dim() != 2 or a.shape[0] != num_tokens for a in self.rope_angles
        ):
            raise BatchError(f"rope_angles must be two [{num_tokens}, R] tables")
        if (self.embed_index is None) != (self.embed_rows is None):
            raise BatchError("embed_index and embed_rows come together")
        if self.embed_index is not None and self.embed_rows is not None:
            if self.embed_index.dim() != 1 or self.embed_rows.dim() != 2:
                raise BatchError("embed_index must be [K] and embed_rows [K, H]")
            if self.embed_rows.shape[0] != self.embed_index.shape[0]:
                raise BatchError(
                    f"{self.embed_index.shape[0]} embed indices but "
                    f"{self.embed_rows.shape[0]} embed rows"
                )

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens)

    @property
    def is_decode(self) -> bool:
        """Every sequence advances by exactly one token (the batched recurrent path)."""
        return self.max_query_len == 1

    @property
    def is_verify(self) -> bool:
        """A speculative verify step of more than one column (see `verify_width`)."""
        return self.verify_width > 1

    @classmethod
    def prefill(
        cls,
        input_ids: Sequence[int] | torch.Tensor,
        *,
        num_computed: int,
        page_ids: Sequence[int] | torch.Tensor,
        state_slot: int,
        device: torch.device | str = "cpu",
        positions: torch.Tensor | None = None,
        embed_index: torch.Tensor | None = None,
        embed_rows: torch.Tensor | None = None,
    ) -> ForwardBatch:
        """A chunk of one sequence continuing after `num_computed` tokens (text positions unless
        `positions` gives the chunk's own, e.g. [3, n] MRoPE positions of a media prompt)."""
        ids = torch.as_tensor(input_ids, dtype=torch.int64, device=device).reshape(-1)
        num_new = ids.shape[0]
        if positions is None:
            positions = torch.arange(num_computed, num_computed + num_new, device=device)
        return cls(
            input_ids=ids,
            positions=positions.to(device=device, dtype=torch.int64),
            cu_seqlens=torch.tensor([0, num_new], dtype=torch.int32, device=device),
            num_computed=torch.tensor([num_computed], dtype=torch.int64, device=device),
            page_table=torch.as_tensor(page_ids, dtype=torch.int32, device=device).reshape(1, -1),
            state_slots=torch.tensor([state_slot], dtype=torch.int64, device=device),
            query_lens=(num_new,),
            max_kv_len=num_computed + num_new,
            embed_index=embed_index,
            embed_rows=embed_rows,
        )

    @classmethod
    def decode(
        cls,
        input_ids: Sequence[int] | torch.Tensor,
        *,
        num_computed: Sequence[int],
        page_tables: Sequence[Sequence[int]],
        state_slots: Sequence[int],
        max_pages: int | None = None,
        device: torch.device | str = "cpu",
        position_offsets: Sequence[int] | None = None,
    ) -> ForwardBatch:
        """One new token per sequence; page tables are right-padded with their first page id.
        A row's RoPE position is its KV index plus its `position_offsets` entry (the rope delta
        of a media prompt; 0 for text)."""
        ids = torch.as_tensor(input_ids, dtype=torch.int64, device=device).reshape(-1)
        num_seqs = ids.shape[0]
        if not len(num_computed) == len(page_tables) == len(state_slots) == num_seqs:
            raise BatchError("decode needs one num_computed, page table and state slot per token")
        width = max_pages if max_pages is not None else max(len(p) for p in page_tables)
        rows = []
        for pages in page_tables:
            if not 0 < len(pages) <= width:
                raise BatchError(f"page table of {len(pages)} pages does not fit width {width}")
            rows.append(list(pages) + [pages[0]] * (width - len(pages)))
        computed = [int(n) for n in num_computed]
        rope = computed
        if position_offsets is not None:
            if len(position_offsets) != num_seqs:
                raise BatchError("decode needs one position offset per token")
            rope = [n + int(d) for n, d in zip(computed, position_offsets, strict=True)]
        return cls(
            input_ids=ids,
            positions=torch.tensor(rope, dtype=torch.int64, device=device),
            cu_seqlens=torch.arange(num_seqs + 1, dtype=torch.int32, device=device),
            num_computed=torch.tensor(computed, dtype=torch.int64, device=device),
            page_table=torch.tensor(rows, dtype=torch.int32, device=device),
            state_slots=torch.as_tensor(list(state_slots), dtype=torch.int64, device=device),
            query_lens=(1,) * num_seqs,
            max_kv_len=max(computed) + 1,
        )
