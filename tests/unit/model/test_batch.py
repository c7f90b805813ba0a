"""ForwardBatch constructors and shape validation."""

from __future__ import annotations

import pytest
import torch

from ninfer.model.batch import ForwardBatch
from ninfer.model.errors import BatchError


def test_prefill_continues_after_num_computed():
    b = ForwardBatch.prefill([5, 6, 7], num_computed=10, page_ids=[4, 2], state_slot=3)
    assert b.positions.tolist() == [10, 11, 12]
    assert b.cu_seqlens.tolist() == [0, 3] and b.num_computed.tolist() == [10]
    assert b.page_table.tolist() == [[4, 2]] and b.page_table.dtype == torch.int32
    assert b.state_slots.tolist() == [3]
    assert (b.num_tokens, b.num_seqs, b.max_query_len, b.max_kv_len) == (3, 1, 3, 13)
    assert not b.is_decode


def test_decode_pads_page_tables():
    b = ForwardBatch.decode(
        [1, 2], num_computed=[4, 70], page_tables=[[9], [3, 8]], state_slots=[1, 0], max_pages=3
    )
    assert b.positions.tolist() == [4, 70] and b.cu_seqlens.tolist() == [0, 1, 2]
    assert b.page_table.tolist() == [[9, 9, 9], [3, 8, 3]]
    assert b.is_decode and b.max_kv_len == 71 and b.query_lens == (1, 1)


def test_mrope_positions_accepted():
    b = ForwardBatch.prefill([1, 2], num_computed=0, page_ids=[0], state_slot=0)
    b.positions = torch.zeros(3, 2, dtype=torch.int64)
    b.__post_init__()


@pytest.mark.parametrize(
    "change, message",
    [
        ({"query_lens": (2,)}, "query_lens"),
        ({"positions": torch.zeros(2, 3, dtype=torch.int64)}, "MRoPE positions need 3 rows"),
        ({"positions": torch.zeros(4, dtype=torch.int64)}, "positions shape"),
        ({"cu_seqlens": torch.tensor([0, 1, 3])}, "cu_seqlens shape"),
        ({"state_slots": torch.tensor([0, 1])}, "state_slots shape"),
        ({"page_table": torch.zeros(2, 1, dtype=torch.int32)}, "page_table shape"),
    ],
)
def test_inconsistent_batches_are_rejected(change, message):
    base = ForwardBatch.prefill([1, 2, 3], num_computed=0, page_ids=[0], state_slot=0)
    fields = {**base.__dict__, **change}
    with pytest.raises(BatchError, match=message):
        ForwardBatch(**fields)


def test_decode_needs_matching_lists():
    with pytest.raises(BatchError, match="one num_computed"):
        ForwardBatch.decode([1, 2], num_computed=[0], page_tables=[[0], [1]], state_slots=[0, 1])
    with pytest.raises(BatchError, match="does not fit width"):
        ForwardBatch.decode(
            [1], num_computed=[0], page_tables=[[0, 1]], state_slots=[0], max_pages=1
        )
