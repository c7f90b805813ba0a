"""Paged attention vs dense causal attention; the gated attention layer vs transformers.

Pages are shuffled and sequences start at non-zero num_computed, so any slip in page or offset
arithmetic shows up. fp32 throughout; references accumulate in fp64.
"""

from __future__ import annotations

import random

import pytest
import torch

from ninfer.kernels import dispatch
from ninfer.model.batch import ForwardBatch
from ninfer.model.layers.gated_attention import (
    AttentionWeights,
    build_attention_metadata,
    continued_causal_attention,
    fresh_causal_attention,
    gated_attention,
    paged_attention,
)
from ninfer.model.layers.rope import mrope_axis_map, rope_cos_sin, rope_inv_freq

HQ, HK, D, P = 4, 2, 8, 4


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def dense_causal_attention(q, k, v, num_computed: int) -> torch.Tensor:
    """q [n, Hq, D] at KV positions num_computed.., k/v [L, Hk, D]; fp64 softmax."""
    n, length = q.shape[0], k.shape[0]
    rep = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(rep, dim=1)
    v = v.double().repeat_interleave(rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k) * D**-0.5
    q_pos = torch.arange(n)[:, None] + num_computed
    scores = scores.masked_fill(torch.arange(length)[None, :] > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def make_varlen_batch(num_computed, query_lens, page_tables):
    ids = torch.zeros(sum(query_lens), dtype=torch.int64)
    cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    width = max(len(t) for t in page_tables)
    table = [t + [t[0]] * (width - len(t)) for t in page_tables]
    return ForwardBatch(
        input_ids=ids,
        positions=torch.cat(
            [torch.arange(c, c + n) for c, n in zip(num_computed, query_lens, strict=True)]
        ),
        cu_seqlens=cu,
        num_computed=torch.tensor(num_computed),
        page_table=torch.tensor(table, dtype=torch.int32),
        state_slots=torch.arange(len(query_lens)),
        query_lens=tuple(query_lens),
        max_kv_len=max(c + n for c, n in zip(num_computed, query_lens, strict=True)),
    )


@pytest.mark.parametrize(
    ("num_computed", "query_lens"),
    [([0], [13]), ([9], [6]), ([5, 0, 17], [3, 8, 1]), ([3, 30, 11, 0], [1, 1, 1, 1])],
    ids=["prefill", "continued-prefill", "varlen", "decode"],
)
def test_paged_attention_matches_dense(num_computed, query_lens):
    gen = torch.Generator().manual_seed(sum(query_lens))
    pool = list(range(40))
    random.Random(len(query_lens)).shuffle(pool)
    k_pages = torch.randn(40, P, HK, D, generator=gen)  # stale data everywhere else
    v_pages = torch.randn(40, P, HK, D, generator=gen)
    full_k, full_v, tables = [], [], []
    for c, n in zip(num_computed, query_lens, strict=True):
        length = c + n
        num_pages = -(-length // P)
        pages, pool = pool[:num_pages], pool[num_pages:]
        tables.append(pages)
        full_k.append(torch.randn(length, HK, D, generator=gen))
        full_v.append(torch.randn(length, HK, D, generator=gen))
        for pos in range(c):  # earlier tokens are already in their pages
            k_pages[pages[pos // P], pos % P] = full_k[-1][pos]
            v_pages[pages[pos // P], pos % P] = full_v[-1][pos]
    batch = make_varlen_batch(num_computed, query_lens, tables)
    meta = build_attention_metadata(batch, P)
    new_k = torch.cat([k[c:] for k, c in zip(full_k, num_computed, strict=True)])
    new_v = torch.cat([v[c:] for v, c in zip(full_v, num_computed, strict=True)])
    dispatch.store_kv(new_k, k_pages, meta.slot_mapping)
    dispatch.store_kv(new_v, v_pages, meta.slot_mapping)
    for k, v, pages in zip(full_k, full_v, tables, strict=True):  # the stored layout itself
        for pos in range(k.shape[0]):
            assert torch.equal(k_pages[pages[pos // P], pos % P], k[pos])
            assert torch.equal(v_pages[pages[pos // P], pos % P], v[pos])

    q = torch.randn(sum(query_lens), HQ, D, generator=gen)
    got = paged_attention(q, k_pages, v_pages, meta, scale=D**-0.5)
    start = 0
    for b, (c, n) in enumerate(zip(num_computed, query_lens, strict=True)):
        expected = dense_causal_attention(q[start : start + n], full_k[b], full_v[b], c)
        assert rel_err(got[start : start + n], expected) < 1e-5, b
        start += n


def test_fresh_causal_attention_matches_dense():
    """The mask-free path CUDA prefills of a fresh sequence take, against the fp64 reference."""
    gen = torch.Generator().manual_seed(21)
    q = torch.randn(19, HQ, D, generator=gen)
    k = torch.randn(19, HK, D, generator=gen)
    v = torch.randn(19, HK, D, generator=gen)
    got = fresh_causal_attention(q, k, v, scale=D**-0.5)
    assert got.shape == q.shape
    assert rel_err(got, dense_causal_attention(q, k, v, 0)) < 1e-5


@pytest.mark.parametrize(("num_computed", "query_len"), [(9, 6), (16, 4), (3, 29), (1, 2)])
def test_continued_causal_attention_matches_dense(num_computed: int, query_len: int):
    """The mask-free path CUDA takes for a later prefill chunk of one sequence, over shuffled
    pages with stale data past the sequence's end, against the fp64 reference."""
    gen = torch.Generator().manual_seed(num_computed * 31 + query_len)
    length = num_computed + query_len
    pool = list(range(30))
    random.Random(length).shuffle(pool)
    pages = pool[: -(-length // P)]
    k_pages = torch.randn(30, P, HK, D, generator=gen)
    v_pages = torch.randn(30, P, HK, D, generator=gen)
    full_k = torch.randn(length, HK, D, generator=gen)
    full_v = torch.randn(length, HK, D, generator=gen)
    batch = make_varlen_batch([num_computed], [query_len], [pages])
    meta = build_attention_metadata(batch, P)
    for pos in range(length):
        k_pages[pages[pos // P], pos % P] = full_k[pos]
        v_pages[pages[pos // P], pos % P] = full_v[pos]
    q = torch.randn(query_len, HQ, D, generator=gen)
    got = continued_causal_attention(q, k_pages, v_pages, meta, scale=D**-0.5)
    assert got.shape == q.shape
    assert rel_err(got, dense_causal_attention(q, full_k, full_v, num_computed)) < 1e-5


def test_layer_matches_transformers_module():
    transformers = pytest.importorskip("transformers")
    hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    rope = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    }
    config = transformers.Qwen3_5TextConfig(
        vocab_size=32,
        hidden_size=48,
        num_hidden_layers=1,
        layer_types=["full_attention"],
        num_attention_heads=HQ,
        num_key_value_heads=HK,
        head_dim=16,
        intermediate_size=32,
        rope_parameters=rope,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    module = hf.Qwen3_5Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5)
    rotary = hf.Qwen3_5TextRotaryEmbedding(config)
    num_tokens = 21
    x = torch.randn(num_tokens, 48)
    positions = torch.arange(num_tokens)
    with torch.no_grad():
        cos_hf, sin_hf = rotary(x[None], positions[None, None].expand(3, 1, -1))
        mask = torch.full((num_tokens, num_tokens), float("-inf")).triu(1)[None, None]
        expected, _ = module(x[None], (cos_hf, sin_hf), attention_mask=mask)

    w = AttentionWeights(
        **{
            name: getattr(module, name).weight.detach()
            for name in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
        }
    )
    k_pages = torch.zeros(12, P, HK, 16)
    v_pages = torch.zeros(12, P, HK, 16)
    pages = [11, 2, 7, 0, 5, 9]
    batch = ForwardBatch.prefill(
        torch.zeros(num_tokens, dtype=torch.int64), num_computed=0, page_ids=pages, state_slot=0
    )
    cos, sin = rope_cos_sin(positions, rope_inv_freq(8, 10000.0), mrope_axis_map((2, 1, 1), True))
    got = gated_attention(
        x,
        w,
        cos=cos,
        sin=sin,
        k_pages=k_pages,
        v_pages=v_pages,
        meta=build_attention_metadata(batch, P),
        eps=config.rms_norm_eps,
    )
    assert rel_err(got, expected[0]) < 1e-5
