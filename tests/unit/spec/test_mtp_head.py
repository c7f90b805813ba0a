"""MtpHead against a reference built from transformers' own Qwen3.5 decoder layer (CPU, fp32).

transformers has no Qwen3.5 MTP module (it drops `mtp.*` on load), so the reference is the
head's definition written out here (as vLLM's Qwen3.5 MTP model defines it): both inputs
(1+w)-RMS-normed, embedding first, `fc`, then transformers' full-attention decoder layer of
the same config (gated attention, dense MLP or sparse MoE) loaded with the `mtp.layers.0.*`
weights, then the final (1+w) norm and the shared lm_head. ninfer's head runs over paged KV:
one prefill chunk, then a second chunk and single-token steps; all must match the one-shot
reference (relative error 1e-4 on fp32 logits).
"""

from __future__ import annotations

import pytest
import torch

from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache

transformers = pytest.importorskip("transformers")
TOL = 1e-4


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def _reference(tiny, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Logits [T, V] of the head for rows (hidden[p], ids[p]) at positions 0..T-1."""
    text = dict(tiny.artifact.config["text"])
    moe = "num_experts" in text and text.get("num_experts")
    if moe:
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as m

        config = m.Qwen3_5MoeTextConfig(**text)
        layer_cls = m.Qwen3_5MoeDecoderLayer
    else:
        from transformers.models.qwen3_5 import modeling_qwen3_5 as m

        config = m.Qwen3_5TextConfig(**text)
        layer_cls = m.Qwen3_5DecoderLayer
    config._attn_implementation = "eager"
    full = config.layer_types.index("full_attention")
    layer = layer_cls(config, full).eval()
    weights = tiny.artifact.load("mtp")
    state = {k.removeprefix("layers.0."): v.float() for k, v in weights.items() if "layers.0." in k}
    missing, unexpected = layer.load_state_dict(state, strict=False)
    assert not unexpected and not [k for k in missing if "rotary" not in k], (missing, unexpected)
    rotary = (
        m.Qwen3_5MoeTextRotaryEmbedding(config) if moe else m.Qwen3_5TextRotaryEmbedding(config)
    )
    eps = config.rms_norm_eps
    w = {k: v.float() for k, v in weights.items() if not k.startswith("layers.")}
    embed = tiny.model.embed_tokens[ids]
    x = torch.cat(
        (_norm(embed, w["pre_fc_norm_embedding.weight"], eps),
         _norm(hidden, w["pre_fc_norm_hidden.weight"], eps)),
        dim=-1,
    ) @ w["fc.weight"].T  # fmt: skip
    t = ids.shape[0]
    positions = torch.arange(t)[None]
    cos_sin = rotary(x[None], positions)
    mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        y = layer(x[None], position_embeddings=cos_sin, attention_mask=mask, position_ids=positions)
    y = y[0] if isinstance(y, tuple) else y
    return _norm(y[0], w["norm.weight"], eps) @ tiny.model.lm_head.T


def test_mtp_head_matches_reference_prefill_and_steps(tiny) -> None:
    model, head = tiny.model, tiny.head
    g = torch.Generator().manual_seed(2)
    t = 23
    ids = torch.randint(0, model.config.vocab_size, (t,), generator=g)
    hidden = torch.randn((t, model.config.hidden_size), generator=g)
    want = _reference(tiny, ids, hidden)
    cache = ModelCache.allocate(
        model.config, num_pages=8, num_slots=2, page_size=8, dtype=torch.float32,
        extra_attention_layers=1,
    )  # fmt: skip
    pages = [5, 2, 7]  # shuffled: contiguity is never assumed
    got = []
    for start, end in ((0, 13), (13, 20)):
        batch = ForwardBatch.prefill(
            ids[start:end], num_computed=start, page_ids=pages, state_slot=0
        )
        got.append(head.compute_logits(head.forward_hidden(batch, cache, hidden[start:end])))
    for p in range(20, t):
        batch = ForwardBatch.decode(
            ids[p : p + 1], num_computed=[p], page_tables=[pages], state_slots=[0]
        )
        got.append(head.compute_logits(head.forward_hidden(batch, cache, hidden[p : p + 1])))
    out = torch.cat(got)
    err = ((out - want).abs().max() / want.abs().max()).item()
    assert err < TOL, err
    # the head's KV is its own: the target's full-attention pages were never written
    assert all(not k.any() for k in cache.k_pages[:-1])
    assert cache.k_pages[-1][pages].any()


def test_engine_drafts_equal_a_plain_reference_of_the_head(tiny) -> None:
    """The head's drafts, as the engine computes them (prefill in two chunks, then rounds that
    keep every prefix length: oracle drafts are verified, the head's own are recorded before
    the oracle replaces them), equal a plain recomputation: the target over tokens 0..P in one
    pass, the head over (h_p, token p + 1) for p <= P, its row P's argmax, then k - 1 steps
    feeding its own hidden and draft back. This checks the shifted passes (row a of a verify),
    the head's KV and positions, not only that the output stays exact."""
    from ninfer.engine.handles import RequestHandle
    from support.spec_engines import OracleDrafts, prompt, tokens

    k, model, head = 3, tiny.model, tiny.head
    p = prompt(3, 21)
    with tiny.engine(max_concurrency=1) as plain:
        req = plain.make_request(p, max_tokens=14, ignore_eos=True, greedy=True, request_id="x")
        full = p + tokens(list(RequestHandle(plain.core, req)))
    seen: list[tuple[int, list[int]]] = []  # (P, the head's drafts from its row at P)
    with tiny.engine(spec="mtp", draft_tokens=k, max_concurrency=1) as engine:
        spec = engine.core.runner.spec

        def recording(slots, positions) -> None:
            for slot, pos in zip(slots.tolist(), positions.tolist(), strict=True):
                seen.append((pos, spec.drafts[slot].tolist()))

        spec.on_drafts = recording
        OracleDrafts(engine, {"x": full})
        req = engine.make_request(p, max_tokens=14, ignore_eos=True, greedy=True, request_id="x")
        events = list(RequestHandle(engine.core, req))
    assert p + tokens(events) == full
    assert events[-1].stats.speculative["accepted_tokens"] >= 3
    assert len({pos - len(p) for pos, _ in seen}) >= 4
    vocab = min(tiny.tokenizer.vocab_size, model.config.vocab_size)
    for position, drafts in seen:
        if position + k + 1 > len(full):
            continue  # the request ended there: no reference continuation to compare
        cache = ModelCache.allocate(
            model.config, num_pages=8, num_slots=1, page_size=16, dtype=torch.float32,
            extra_attention_layers=1,
        )  # fmt: skip
        pages = list(range(8))
        ids = torch.tensor(full[: position + 2])
        batch = ForwardBatch.prefill(ids[:-1], num_computed=0, page_ids=pages, state_slot=0)
        hidden = model.forward_hidden(batch, cache)
        shifted = ForwardBatch.prefill(ids[1:], num_computed=0, page_ids=pages, state_slot=0)
        h = head.forward_hidden(shifted, cache, hidden)[-1:]
        want = []
        for i in range(k):
            d = head.compute_logits(h)[:, :vocab].argmax(-1)
            want.append(int(d))
            step = ForwardBatch.decode(
                d, num_computed=[position + 1 + i], page_tables=[pages], state_slots=[0]
            )
            h = head.forward_hidden(step, cache, h)
        assert drafts == want, position
