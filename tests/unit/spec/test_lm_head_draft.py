"""`lm_head_draft`: the 4-bit shortlist proposal head. Packing is exact, the dequantized weights
are within half a quantization step, proposals are the shortlist's argmax mapped to token ids,
and an engine drafting through it still commits exactly the plain greedy tokens."""

from __future__ import annotations

import torch

from ninfer.engine.handles import RequestHandle
from ninfer.model import lm_head_draft
from ninfer.model.lm_head_draft import ShortlistHead, dequantize_int4, quantize_int4
from support.spec_engines import prompt, tokens


def test_int4_groups_round_trip_within_half_a_step() -> None:
    w = torch.randn((40, 128), generator=torch.Generator().manual_seed(1))
    packed, scale = quantize_int4(w)
    assert packed.dtype == torch.uint8 and packed.shape == (40, 64) and scale.shape == (40, 2)
    back = dequantize_int4(packed, scale, torch.float32)
    step = scale.repeat_interleave(64, dim=1)
    assert ((back - w).abs() <= step / 2 + 1e-6).all()
    again, _ = quantize_int4(back)  # dequantized values quantize to the same nibbles
    assert torch.equal(again, packed)


def test_shortlist_proposes_its_argmax_as_token_ids() -> None:
    g = torch.Generator().manual_seed(2)
    lm_head = torch.randn((300, 64), generator=g)
    head = ShortlistHead(lm_head, num_sampleable=280, size=200)
    assert head.size == 200
    hidden = torch.randn((5, 64), generator=g)
    want = (hidden @ dequantize_int4(head.packed, head.scale, torch.float32).T).argmax(-1)
    assert torch.equal(head.propose(hidden), want)
    assert (head.propose(torch.randn((50, 64), generator=g)) < 200).all()


def test_engine_with_lm_head_draft_equals_plain(dense, monkeypatch) -> None:
    monkeypatch.setattr(lm_head_draft, "DEFAULT_SIZE", 512)  # half the tiny vocabulary
    p = prompt(11, 17)
    with dense.engine(max_concurrency=1) as plain:
        want = tokens(list(plain.generate(p, max_tokens=12, ignore_eos=True, greedy=True)))
    seen: list[int] = []
    with dense.engine(spec="mtp", draft_tokens=3, lm_head_draft=True) as engine:
        spec = engine.core.runner.spec
        assert spec.shortlist is not None and spec.shortlist.size == 512
        spec.on_drafts = lambda slots, _: seen.extend(spec.drafts[slots].flatten().tolist())
        req = engine.make_request(p, max_tokens=12, ignore_eos=True, greedy=True)
        got = tokens(list(RequestHandle(engine.core, req)))
    assert got == want
    assert seen and max(seen) < 512  # every draft came from the shortlist
