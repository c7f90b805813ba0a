"""A tiny MTP head trained in the fixture on its own target's greedy continuations: the engine's
measured acceptance length is well above 1, and equals what a plain torch reference of the head
and the round predicts on the same prompts (drafts recomputed from scratch, rounds replayed over
the known greedy output), round for round."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ninfer.engine.handles import RequestHandle
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.mtp import MtpHead
from support.spec_engines import prompt, tokens

transformers = pytest.importorskip("transformers")
K = 3
MAX_TOKENS = 24


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def _hidden(model, ids: list[int]) -> torch.Tensor:
    cache = ModelCache.allocate(model.config, num_pages=8, num_slots=1, page_size=16,
                                dtype=torch.float32)  # fmt: skip
    batch = ForwardBatch.prefill(ids, num_computed=0, page_ids=list(range(8)), state_slot=0)
    return model.forward_hidden(batch, cache)


def _train(tiny, sequences: list[list[int]]) -> dict[str, torch.Tensor]:
    """Fit the head (fc, its norms, its decoder layer) to predict token p + 2 from (h_p, token
    p + 1) over the sequences; returns its weights under the artifact's `mtp.` names."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    torch.manual_seed(0)
    config = m.Qwen3_5TextConfig(**dict(tiny.artifact.config["text"]))
    config._attn_implementation = "eager"
    layer = m.Qwen3_5DecoderLayer(config, config.layer_types.index("full_attention"))
    start = tiny.artifact.load("mtp")
    layer.load_state_dict(
        {k.removeprefix("layers.0."): v.float() for k, v in start.items() if "layers.0." in k},
        strict=False,
    )
    rotary = m.Qwen3_5TextRotaryEmbedding(config)
    free = {k: torch.nn.Parameter(v.float().clone()) for k, v in start.items()
            if not k.startswith("layers.")}  # fmt: skip
    eps = config.rms_norm_eps
    model = tiny.model
    data = [(torch.tensor(s), _hidden(model, s)) for s in sequences]
    optim = torch.optim.Adam([*layer.parameters(), *free.values()], lr=3e-3)
    for _ in range(60):
        loss = torch.zeros(())
        for ids, hidden in data:
            t = ids.shape[0] - 2
            embed = _norm(
                model.embed_tokens[ids[1 : t + 1]], free["pre_fc_norm_embedding.weight"], eps
            )
            x = torch.cat((embed, _norm(hidden[:t], free["pre_fc_norm_hidden.weight"], eps)), -1)
            x = x @ free["fc.weight"].T
            pos = torch.arange(t)[None]
            mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
            y = layer(x[None], position_embeddings=rotary(x[None], pos), attention_mask=mask,
                      position_ids=pos)  # fmt: skip
            y = y[0] if isinstance(y, tuple) else y
            logits = _norm(y[0], free["norm.weight"], eps) @ model.lm_head.T
            loss = loss + torch.nn.functional.cross_entropy(logits, ids[2 : t + 2])
        optim.zero_grad()
        loss.backward()
        optim.step()
    out = {k: v.detach().clone() for k, v in free.items()}
    out |= {"layers.0." + k: v.detach().clone() for k, v in layer.state_dict().items()}
    return {k: v for k, v in out.items() if k in start}


def _reference_drafts(model, head, ids: list[int], position: int) -> list[int]:
    """d1..dk of the round fed at `position`: the head over (h_p, token p+1) for p < position,
    then k - 1 steps feeding its own hidden and draft back (fresh caches, one pass each)."""
    cache = ModelCache.allocate(model.config, num_pages=8, num_slots=1, page_size=16,
                                dtype=torch.float32, extra_attention_layers=1)  # fmt: skip
    pages = list(range(8))
    t = torch.tensor(ids[: position + 1])
    hidden = model.forward_hidden(ForwardBatch.prefill(t[:-1], num_computed=0, page_ids=pages,
                                                       state_slot=0), cache)  # fmt: skip
    shifted = ForwardBatch.prefill(t[1:], num_computed=0, page_ids=pages, state_slot=0)
    h = head.forward_hidden(shifted, cache, hidden)[-1:]
    out = []
    for i in range(K):
        d = head.compute_logits(h).argmax(-1)
        out.append(int(d))
        step = ForwardBatch.decode(d, num_computed=[position + i], page_tables=[pages],
                                   state_slots=[0])  # fmt: skip
        h = head.forward_hidden(step, cache, h)
    return out


def test_trained_head_accepts_and_matches_the_reference_round(dense) -> None:
    prompts = [prompt(60 + i, 14) for i in range(2)]
    with dense.engine(max_concurrency=1, max_context=128) as plain:
        outs = [tokens(list(plain.generate(p, max_tokens=MAX_TOKENS, ignore_eos=True,
                                           greedy=True))) for p in prompts]  # fmt: skip
    full = [p + o for p, o in zip(prompts, outs, strict=True)]
    head = MtpHead(dense.model, _train(dense, full))
    trained = dataclasses.replace(dense, head=head)
    for p, seq in zip(prompts, full, strict=True):
        with trained.engine(spec="mtp", draft_tokens=K, max_concurrency=1, max_context=128) as e:
            req = e.make_request(p, max_tokens=MAX_TOKENS, ignore_eos=True, greedy=True)
            events = list(RequestHandle(e.core, req))
        assert p + tokens(events) == seq
        got = events[-1].stats.speculative
        # the reference round: drafts from scratch, accepted while equal to the greedy output
        rounds = accepted = 0
        position, committed = len(p), 1  # t0 (the prefill's token) sits at len(p)
        while committed < MAX_TOKENS:
            drafts = _reference_drafts(dense.model, head, seq, position)
            a = 0
            while a < K and drafts[a] == seq[position + 1 + a]:
                a += 1
            rounds, accepted = rounds + 1, accepted + a
            position, committed = position + a + 1, committed + a + 1
        assert (got["rounds"], got["accepted_tokens"]) == (rounds, accepted)
        assert (rounds + accepted) / rounds > 1.5, got  # well above 1: the head learned
        print(f"acceptance length {(rounds + accepted) / rounds:.2f} over {rounds} rounds")
