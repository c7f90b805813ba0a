"""engine.penalty_counts against count_output_ids (the from-scratch definition) over random
request lifecycles: slot reuse after finish or cancellation, rows skipped for several steps,
several tokens committed at once (thinking-budget control suffixes) and steps that commit none."""

from __future__ import annotations

import gc
import random
import weakref
from dataclasses import dataclass, field

import pytest
import torch

from ninfer.engine.penalty_counts import PenaltyCounts
from ninfer.engine.sampling import count_output_ids


@dataclass(eq=False)
class FakeSeq:
    token_ids: list[int]
    num_prompt: int
    slot: int | None = None
    outputs: list[int] = field(default_factory=list)

    def commit(self, ids: list[int]) -> None:
        self.token_ids.extend(ids)


def _expected(seqs: list[FakeSeq], num_columns: int) -> torch.Tensor:
    return count_output_ids([s.token_ids[s.num_prompt :] for s in seqs], num_columns)


@pytest.mark.parametrize("seed", range(4))
def test_random_lifecycles_match_count_output_ids(seed: int) -> None:
    rng = random.Random(seed)
    num_slots, num_columns = 5, 37
    counts = PenaltyCounts(num_slots, num_columns, "cpu")
    free = list(range(num_slots))
    running: list[FakeSeq] = []
    num_checked_rows = num_reused = 0
    used_slots: set[int] = set()
    for _ in range(400):
        # admit: a fresh sequence takes any free slot (often one a finished sequence left dirty)
        while free and rng.random() < 0.5:
            slot = free.pop(rng.randrange(len(free)))
            num_reused += slot in used_slots
            used_slots.add(slot)
            prompt = [rng.randrange(num_columns) for _ in range(rng.randint(1, 6))]
            running.append(FakeSeq(list(prompt), len(prompt), slot))
        if not running:
            continue
        # a random subset samples this step (others prefill or sit out); a synced row must equal
        # the from-scratch counts of its output list, whatever happened since its last sync
        batch = rng.sample(running, rng.randint(1, len(running)))
        slots = counts.rows_for(batch)
        assert slots.tolist() == [s.slot for s in batch]
        got = counts.counts.index_select(0, slots)
        assert torch.equal(got, _expected(batch, num_columns))
        num_checked_rows += len(batch)
        # commits: mostly one token, sometimes a control suffix, sometimes nothing (discarded)
        for seq in running:
            size = rng.choice([0, 1, 1, 1, 1, 3])
            seq.commit([rng.randrange(num_columns) for _ in range(size)])
        # finishes and cancellations free slots (rows stay dirty until the next owner syncs)
        for seq in list(running):
            if rng.random() < 0.08:
                running.remove(seq)
                free.append(seq.slot)
                seq.slot = None
    assert num_checked_rows > 500 and num_reused > 20


def test_reused_slot_starts_from_zero_even_if_the_old_owner_lives() -> None:
    counts = PenaltyCounts(2, 10, "cpu")
    old = FakeSeq([1, 2, 3, 3, 3], num_prompt=2, slot=1)
    counts.rows_for([old])
    assert counts.counts[1, 3] == 3
    new = FakeSeq([4, 3], num_prompt=1, slot=1)  # `old` is still referenced here
    counts.rows_for([new])
    assert counts.counts[1].tolist() == [0, 0, 0, 1] + [0] * 6


def test_only_new_tokens_are_added() -> None:
    counts = PenaltyCounts(3, 10, "cpu")
    seq = FakeSeq([9, 9, 9], num_prompt=3, slot=2)  # the prompt never counts
    counts.rows_for([seq])
    assert int(counts.counts.sum()) == 0
    seq.commit([5])
    counts.rows_for([seq])
    seq.commit([5, 7])
    counts.rows_for([seq])
    counts.rows_for([seq])  # nothing new: nothing added twice
    assert counts.counts[2].tolist() == [0, 0, 0, 0, 0, 2, 0, 1, 0, 0]


def test_owners_are_not_kept_alive() -> None:
    counts = PenaltyCounts(1, 4, "cpu")
    seq = FakeSeq([0, 1], num_prompt=1, slot=0)
    counts.rows_for([seq])
    ref = weakref.ref(seq)
    del seq
    gc.collect()
    assert ref() is None


def test_bad_rows_are_rejected_without_changing_state() -> None:
    counts = PenaltyCounts(2, 8, "cpu")
    good = FakeSeq([1, 2], num_prompt=1, slot=0)
    with pytest.raises(ValueError, match="outside 0..7"):
        counts.rows_for([good, FakeSeq([1, 8], num_prompt=1, slot=1)])
    assert int(counts.counts.sum()) == 0
    counts.rows_for([good])  # the failed call did not mark token 2 as counted
    assert counts.counts[0, 2] == 1
    with pytest.raises(ValueError, match="slot"):
        counts.rows_for([FakeSeq([1], num_prompt=1, slot=None)])
    with pytest.raises(ValueError, match="slot 5"):
        counts.rows_for([FakeSeq([1], num_prompt=1, slot=5)])
    with pytest.raises(ValueError, match="share"):
        counts.rows_for([good, FakeSeq([1], num_prompt=1, slot=0)])
