"""The verify step leaves the DeltaNet state alone; folding n of its columns gives, bit for bit,
the state its own column-by-column recurrence reached after column n - 1 (the rollback is exact),
and that state is the one n single-token decode steps over the same tokens reach, up to the
rounding of the input projections (a GEMM over k + 1 rows against one row)."""

from __future__ import annotations

import pytest
import torch

from ninfer.engine.copies import CopyEngine
from ninfer.engine.plan import FOLD, CopyOp
from ninfer.kernels.gated_delta_decode import reference as delta_ref
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache


@pytest.mark.parametrize("num_kept", [1, 2, 4])
def test_fold_equals_decode_steps_bitwise(dense, num_kept: int) -> None:
    model = dense.model
    cache = ModelCache.allocate(
        model.config, num_pages=8, num_slots=2, page_size=16, dtype=torch.float32,
        extra_attention_layers=1,
    )  # fmt: skip
    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, 1024, (19,), generator=g)
    fed = torch.randint(0, 1024, (4,), generator=g)  # t0, d1, d2, d3
    tables = [[0, 1, 2], [3, 4, 5]]
    for slot in (0, 1):
        batch = ForwardBatch.prefill(prompt, num_computed=0, page_ids=tables[slot], state_slot=slot)
        model.forward_hidden(batch, cache)
    before = [t[0].clone() for t in (*cache.conv_state, *cache.ssm_state)]
    # slot 0: one verify step of 4 columns; nothing changes until the fold
    n = len(prompt)
    verify = ForwardBatch(
        input_ids=fed,
        positions=torch.arange(n, n + 4),
        cu_seqlens=torch.tensor([0, 4], dtype=torch.int32),
        num_computed=torch.tensor([n]),
        page_table=torch.tensor([tables[0]], dtype=torch.int32),
        state_slots=torch.tensor([0]),
        query_lens=(4,),
        max_kv_len=n + 4,
        verify_width=4,
        verify_states=[],
    )
    trajectory: list[torch.Tensor] = []  # each linear layer's working state after each column
    real_step = delta_ref.gated_delta_rule_decode  # what the verify twin steps with

    def recording(q, k, v, g, beta, ssm_state, state_slots, *, scale):
        out = real_step(q, k, v, g, beta, ssm_state, state_slots, scale=scale)
        trajectory.append(ssm_state[0].clone())
        return out

    delta_ref.gated_delta_rule_decode = recording
    try:
        verify_logits = model.compute_logits(model.forward_hidden(verify, cache))
    finally:
        delta_ref.gated_delta_rule_decode = real_step
    assert len(trajectory) == 4 * len(cache.ssm_state)  # the patch saw every verify column
    after = [t[0] for t in (*cache.conv_state, *cache.ssm_state)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    cache.verify_records[0] = (0, verify.verify_states)
    CopyEngine(cache, torch.device("cpu")).run([CopyOp(FOLD, (num_kept,), (0,))])
    for j, ssm in enumerate(cache.ssm_state):  # bitwise: the verify's own state after column n-1
        assert torch.equal(ssm[0], trajectory[j * 4 + num_kept - 1]), j
    # slot 1: the same tokens as decode steps
    decode_logits = []
    for i in range(num_kept):
        step = ForwardBatch.decode(
            fed[i : i + 1], num_computed=[n + i], page_tables=[tables[1]], state_slots=[1]
        )
        decode_logits.append(model.forward(step, cache))
    for conv in cache.conv_state:
        torch.testing.assert_close(conv[0], conv[1], rtol=1e-5, atol=1e-5)
    for ssm in cache.ssm_state:
        torch.testing.assert_close(ssm[0], ssm[1], rtol=1e-5, atol=1e-5)
    # the verify's logits are the decode steps' (up to GEMM rounding: k + 1 rows vs 1)
    want = torch.cat(decode_logits)
    torch.testing.assert_close(verify_logits[:num_kept], want, rtol=1e-4, atol=1e-4)
