"""Per-state-slot occurrence counts of generated token ids, kept incrementally for penalties.

Imports torch and the standard library only. A [num_slots, num_columns] int32 buffer on the logits'
device that the sampler reads in place: each step scatters only the tokens a sequence committed
since its previous step (one small upload and one scatter per batch), instead of rebuilding
[B, vocab] counts from every output list. Counts follow the committed token list, never raw
samples, so discarded samples (cancelled rows, rows feeding a thinking-budget control token) and
inserted control tokens count exactly as `sampling.count_output_ids` counts them.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Protocol

import torch


class CountedSequence(Protocol):
    """What the counter reads of a scheduler Sequence: its slot and committed token list."""

    slot: int | None
    token_ids: list[int]
    num_prompt: int


class PenaltyCounts:
    """`counts[slot, id]` = occurrences of `id` among the generated tokens of the slot's owner.

    A slot's row is zeroed when a sequence other than its last owner asks for it (the scheduler
    hands a slot to one running sequence at a time), so slot reuse after a finish, a cancellation
    or an error needs no hook. Owners are held by weak reference: a finished request is not kept
    alive by its old slot.
    """

    def __init__(self, num_slots: int, num_columns: int, device: torch.device | str) -> None:
        if num_slots < 1 or num_columns < 1:
            raise ValueError(f"need slots and columns, got {num_slots} x {num_columns}")
        self.num_slots = num_slots
        self.num_columns = num_columns
        self.device = torch.device(device)
        self.counts = torch.zeros((num_slots, num_columns), dtype=torch.int32, device=self.device)
        self._owners: list[weakref.ref[CountedSequence] | None] = [None] * num_slots
        self._num_counted = [0] * num_slots  # generated tokens of the owner already in the row

    def rows_for(self, seqs: Sequence[CountedSequence]) -> torch.Tensor:
        """Bring each sequence's row up to date; returns their slots as [B] int64 on the device.

        The host work is one pass over the batch plus the tokens committed since the last call;
        the device work is one scatter-add.
        """
        slots: list[int] = []
        claims: list[int] = []
        new_slots: list[int] = []
        new_ids: list[int] = []
        for seq in seqs:
            slot = seq.slot
            if slot is None or not 0 <= slot < self.num_slots:
                raise ValueError(f"sequence has state slot {slot}, outside 0..{self.num_slots - 1}")
            if slot in slots:
                raise ValueError(f"two rows of one batch share state slot {slot}")
            slots.append(slot)
            owner = self._owners[slot]
            claimed = owner is None or owner() is not seq
            if claimed:
                claims.append(slot)
            num_counted = 0 if claimed else self._num_counted[slot]
            fresh = seq.token_ids[seq.num_prompt + num_counted :]
            new_slots.extend([slot] * len(fresh))
            new_ids.extend(fresh)
        if new_ids and not 0 <= min(new_ids) <= max(new_ids) < self.num_columns:
            raise ValueError(f"a generated token id is outside 0..{self.num_columns - 1}")

        for seq, slot in zip(seqs, slots, strict=True):  # validated: commit the host state
            if slot in claims:
                self._owners[slot] = weakref.ref(seq)
            self._num_counted[slot] = len(seq.token_ids) - seq.num_prompt
        if claims:
            self.counts[torch.tensor(claims, dtype=torch.int64).to(self.device)] = 0
        if new_ids:
            index = torch.tensor([new_slots, new_ids], dtype=torch.int64).to(self.device)  # [2, N]
            ones = torch.ones(index.shape[1], dtype=torch.int32, device=self.device)
            self.counts.index_put_((index[0], index[1]), ones, accumulate=True)
        return torch.tensor(slots, dtype=torch.int64).to(self.device)
