"""Qwen3_5Model against transformers' Qwen3_5(Moe)ForCausalLM on tiny random models (CPU).

Tolerances: fp32 logits within 1e-3 relative error (max |a - b| / max |b|); bf16 vs fp32 rows
within 3e-2 (median; the bf16 test says why not the max). page_size 16 so prompts cross pages;
page ids are shuffled so contiguity is never assumed.
"""

from __future__ import annotations

import random
from types import MappingProxyType

import pytest
import torch

from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.config import TextConfig
from ninfer.model.errors import BatchError, WeightError
from ninfer.model.qwen3_5 import Qwen3_5Model

PAGE_SIZE = 16
FP32_TOL = 1e-3


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def make(tiny, dtype=torch.float32) -> tuple[Qwen3_5Model, TextConfig]:
    config = TextConfig.from_hf(tiny.hf_config)
    return Qwen3_5Model(config, tiny.weights, dtype=dtype), config


def new_cache(config: TextConfig, dtype=torch.float32, num_pages=64, num_slots=8) -> ModelCache:
    return ModelCache.allocate(
        config, num_pages=num_pages, num_slots=num_slots, page_size=PAGE_SIZE, dtype=dtype
    )


def shuffled_pages(num: int, seed: int, pool: int = 64) -> list[int]:
    ids = list(range(pool))
    random.Random(seed).shuffle(ids)
    return ids[:num]


def pages_for(num_tokens: int) -> int:
    return -(-num_tokens // PAGE_SIZE)


def prefill(model, cache, ids, *, pages, slot, num_computed=0, all_logits=True) -> torch.Tensor:
    batch = ForwardBatch.prefill(ids, num_computed=num_computed, page_ids=pages, state_slot=slot)
    return model.forward(batch, cache, all_logits=all_logits)


def decode(model, cache, ids, *, num_computed, pages, slots) -> torch.Tensor:
    batch = ForwardBatch.decode(
        ids, num_computed=num_computed, page_tables=pages, state_slots=slots
    )
    return model.forward(batch, cache)


def hf_logits(tiny, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return tiny.hf(ids[None]).logits[0].float()


@pytest.fixture(scope="module")
def prompt_300() -> torch.Tensor:
    return torch.randint(0, 512, (300,), generator=torch.Generator().manual_seed(7))


@pytest.fixture(scope="module")
def hf_logits_300(tiny, prompt_300) -> torch.Tensor:
    """HF logits of the 300-token prompt, computed once per tiny model."""
    return hf_logits(tiny, prompt_300)


@pytest.mark.parametrize("num_tokens", [1, 7, 64, 65, 300])
def test_prefill_logits_match_hf(tiny, prompt_300, hf_logits_300, num_tokens):
    model, config = make(tiny)
    # HF is causal, so the first n rows of its 300-token run are the n-token logits.
    expected = hf_logits_300[:num_tokens]
    cache = new_cache(config)
    pages = shuffled_pages(pages_for(num_tokens), seed=num_tokens)
    got = prefill(model, cache, prompt_300[:num_tokens], pages=pages, slot=3)
    assert got.shape == (num_tokens, config.vocab_size) and got.dtype == torch.float32
    assert rel_err(got, expected) < FP32_TOL
    last = prefill(
        model, new_cache(config), prompt_300[:num_tokens], pages=pages, slot=0, all_logits=False
    )
    assert last.shape == (1, config.vocab_size)
    assert rel_err(last[0], expected[-1]) < FP32_TOL


def test_greedy_decode_matches_hf_generate(tiny):
    num_steps = 64
    prompt = torch.randint(0, 512, (20,), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        out = tiny.hf.generate(
            prompt[None],
            max_new_tokens=num_steps,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=None,
            pad_token_id=0,
        )
    hf_tokens = out.sequences[0, prompt.shape[0] :].tolist()
    hf_step_logits = [x[0].float() for x in out.logits]
    assert len(hf_tokens) == num_steps

    model, config = make(tiny)
    cache = new_cache(config)
    pages = shuffled_pages(pages_for(prompt.shape[0] + num_steps), seed=5)
    logits = prefill(model, cache, prompt, pages=pages, slot=2, all_logits=False)[0]
    tokens, errors = [], []
    for step in range(num_steps):
        errors.append(rel_err(logits, hf_step_logits[step]))
        token = int(logits.argmax())
        tokens.append(token)
        n = prompt.shape[0] + step
        logits = decode(model, cache, [token], num_computed=[n], pages=[pages], slots=[2])[0]
    assert tokens == hf_tokens
    assert max(errors) < FP32_TOL


@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_prefill_matches_one_shot(tiny, prompt_300, chunk):
    model, config = make(tiny)
    num_tokens = 150  # 10 pages of 16; two full 64-token delta-rule chunks and a partial one
    prompt = prompt_300[:num_tokens]
    pages = shuffled_pages(pages_for(num_tokens + 1), seed=chunk)
    one_cache = new_cache(config)
    one_shot = prefill(model, one_cache, prompt, pages=pages, slot=1)
    next_one = decode(model, one_cache, [5], num_computed=[num_tokens], pages=[pages], slots=[1])

    cache = new_cache(config)
    parts = []
    for start in range(0, num_tokens, chunk):
        piece = prompt[start : start + chunk]
        # Each chunk's page table covers only the pages it needs so far.
        covering = pages[: pages_for(start + piece.shape[0])]
        parts.append(prefill(model, cache, piece, pages=covering, slot=4, num_computed=start))
    chunked = torch.cat(parts)
    next_chunked = decode(model, cache, [5], num_computed=[num_tokens], pages=[pages], slots=[4])
    assert rel_err(chunked, one_shot) < FP32_TOL
    assert rel_err(next_chunked, next_one) < FP32_TOL


def test_decode_batch_matches_solo_runs(tiny):
    model, config = make(tiny)
    gen = torch.Generator().manual_seed(3)
    prompt_lens = [3, 17, 33, 50]
    slots = [5, 0, 3, 2]
    num_steps = 4
    prompts = [torch.randint(0, 512, (n,), generator=gen) for n in prompt_lens]
    steps = torch.randint(0, 512, (num_steps, len(prompts)), generator=gen)
    pool = shuffled_pages(64, seed=99)
    page_tables, start = [], 0
    for n in prompt_lens:
        need = pages_for(n + num_steps)
        page_tables.append(pool[start : start + need])
        start += need

    # Solo: each sequence alone in a fresh cache with its own contiguous pages.
    solo = []
    for prompt, column in zip(prompts, steps.T, strict=True):
        cache = new_cache(config)
        pages = list(range(pages_for(prompt.shape[0] + num_steps)))
        prefill(model, cache, prompt, pages=pages, slot=0)
        rows = []
        for s, token in enumerate(column.tolist()):
            n = prompt.shape[0] + s
            rows.append(decode(model, cache, [token], num_computed=[n], pages=[pages], slots=[0]))
        solo.append(torch.cat(rows))  # [num_steps, vocab]

    cache = new_cache(config)
    for prompt, pages, slot in zip(prompts, page_tables, slots, strict=True):
        prefill(model, cache, prompt, pages=pages, slot=slot)
    for s in range(num_steps):
        logits = decode(
            model,
            cache,
            steps[s].tolist(),
            num_computed=[n + s for n in prompt_lens],
            pages=page_tables,
            slots=slots,
        )
        assert logits.shape == (len(prompts), config.vocab_size)
        for b in range(len(prompts)):
            assert rel_err(logits[b], solo[b][s]) < FP32_TOL, (s, b)


def test_multi_sequence_prefill_matches_solo(tiny_dense):
    model, config = make(tiny_dense)
    gen = torch.Generator().manual_seed(21)
    lens = [9, 40, 1]
    prompts = [torch.randint(0, 512, (n,), generator=gen) for n in lens]
    solo = [prefill(model, new_cache(config), p, pages=[0, 1, 2], slot=0) for p in prompts]

    tables = [[7, 3, 50], [12, 1, 9], [33, 34, 35]]
    batch = ForwardBatch(
        input_ids=torch.cat(prompts),
        positions=torch.cat([torch.arange(n) for n in lens]),
        cu_seqlens=torch.tensor([0, 9, 49, 50], dtype=torch.int32),
        num_computed=torch.zeros(3, dtype=torch.int64),
        page_table=torch.tensor(tables, dtype=torch.int32),
        state_slots=torch.tensor([4, 1, 6]),
        query_lens=tuple(lens),
        max_kv_len=max(lens),
    )
    got = model.forward(batch, new_cache(config), all_logits=True)
    assert rel_err(got, torch.cat(solo)) < FP32_TOL


def test_bf16_close_to_fp32(tiny, prompt_300):
    prompt = prompt_300[:64]
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        model, config = make(tiny, dtype)
        cache = new_cache(config, dtype)
        pages = shuffled_pages(pages_for(72), seed=1)
        rows = [prefill(model, cache, prompt, pages=pages, slot=0)]
        for s, token in enumerate(prompt_300[64:72].tolist()):
            step = decode(model, cache, [token], num_computed=[64 + s], pages=[pages], slots=[0])
            rows.append(step)
        results[dtype] = torch.cat(rows)
    bf16, fp32 = results[torch.bfloat16], results[torch.float32]
    assert bf16.dtype == torch.float32 and torch.isfinite(bf16).all()
    # Measured here: per-row errors about 1e-2 for both models. A token whose router picks a
    # different expert in bf16 can be far off (MoE max error up to ~0.6 over seeds, transformers'
    # own bf16 alike), so the bound is on the median row and the max only for the dense model.
    row_err = (bf16 - fp32).abs().amax(-1) / fp32.abs().amax(-1)
    assert row_err.median().item() < 3e-2
    if not TextConfig.from_hf(tiny.hf_config).is_moe:
        assert rel_err(bf16, fp32) < 5e-2
    agree = (bf16.argmax(-1) == fp32.argmax(-1)).float().mean().item()
    assert agree > 0.85


def test_reset_slot_restarts_sequence(tiny_dense, prompt_300):
    model, config = make(tiny_dense)
    cache = new_cache(config)
    first = prefill(model, cache, prompt_300[:10], pages=[0], slot=2)
    prefill(model, cache, prompt_300[10:30], pages=[0, 1], slot=2, num_computed=10)
    cache.reset_slot(2)
    again = prefill(model, cache, prompt_300[:10], pages=[5], slot=2)
    assert rel_err(again, first) < 1e-6


def test_missing_weight_is_named(tiny_dense):
    config = TextConfig.from_hf(tiny_dense.hf_config)
    weights = dict(tiny_dense.weights)
    del weights["layers.2.linear_attn.A_log"]
    with pytest.raises(WeightError, match=r"layers\.2\.linear_attn\.A_log"):
        Qwen3_5Model(config, weights)


def test_wrong_shape_is_named(tiny_dense):
    config = TextConfig.from_hf(tiny_dense.hf_config)
    weights = dict(tiny_dense.weights)
    weights["layers.3.self_attn.k_proj.weight"] = torch.zeros(3, 64)
    with pytest.raises(WeightError, match=r"k_proj.*\[3, 64\]"):
        Qwen3_5Model(config, weights)


def test_unexpected_weight_strict_and_lenient(tiny_dense):
    config = TextConfig.from_hf(tiny_dense.hf_config)
    weights = {**tiny_dense.weights, "mtp.fc.weight": torch.zeros(2, 2)}
    with pytest.raises(WeightError, match="mtp.fc.weight"):
        Qwen3_5Model(config, weights)
    Qwen3_5Model(config, weights, strict=False)


def test_tied_embeddings_use_embed_table(tiny_dense):
    config = TextConfig.from_hf({**tiny_dense.hf_config, "tie_word_embeddings": True})
    weights = {k: v for k, v in tiny_dense.weights.items() if k != "lm_head.weight"}
    model = Qwen3_5Model(config, weights)
    hidden = torch.randn(3, config.hidden_size)
    expected = hidden @ weights["embed_tokens.weight"].T
    assert rel_err(model.compute_logits(hidden), expected) < 1e-6


def test_fused_projections_match_separate(tiny, prompt_300):
    """One concatenated GEMM per projection group (the CUDA default) computes the same step."""
    config = TextConfig.from_hf(tiny.hf_config)
    fused = Qwen3_5Model(config, tiny.weights, fuse_projections=True)
    plain = Qwen3_5Model(config, tiny.weights)
    assert not plain.fuse_projections
    layer = fused.layers[0]
    mixer_fused = getattr(layer.mixer, "in_proj_fused", None)
    if mixer_fused is None:
        mixer_fused = layer.mixer.qkv_fused
    assert mixer_fused is not None
    ffn = layer.ffn
    ffn_fused = ffn.gate_up if hasattr(ffn, "gate_up") else ffn.shared_gate_up
    assert ffn_fused is not None
    if hasattr(ffn, "router_and_gate"):  # MoE: router and shared-expert gate in one matrix
        assert ffn.router_and_gate is not None
        assert ffn.router.data_ptr() == ffn.router_and_gate.data_ptr()
        # zero rows pad it to a multiple of 8 (16-byte aligned output rows for cuBLAS)
        num_real = ffn.router.shape[0] + 1
        assert ffn.router_and_gate.shape[0] % 8 == 0
        assert ffn.router_and_gate.shape[0] - num_real < 8
        assert torch.equal(ffn.router_and_gate[num_real - 1 : num_real], ffn.shared_gate)
        assert not ffn.router_and_gate[num_real:].any()
        # and the shared expert's gate-up after them: one matrix, both narrower ones its views
        whole = ffn.router_gate_shared
        assert whole is not None and whole.data_ptr() == ffn.router_and_gate.data_ptr()
        head = ffn.router_and_gate.shape[0]
        assert whole.shape[0] == head + ffn.shared_gate_up.shape[0]
        assert ffn.shared_gate_up.data_ptr() == whole[head:].data_ptr()
        assert torch.equal(whole[head:], torch.cat((ffn.shared_gate_proj, ffn.shared_up_proj)))
    rows = {}
    for name, model in (("fused", fused), ("plain", plain)):
        cache = new_cache(config)
        pages = shuffled_pages(pages_for(41), seed=4)
        out = [prefill(model, cache, prompt_300[:40], pages=pages, slot=1)]
        out.append(decode(model, cache, [9], num_computed=[40], pages=[pages], slots=[1]))
        rows[name] = torch.cat(out)
    assert rel_err(rows["fused"], rows["plain"]) < 1e-5


def test_consumed_weights_leave_only_extras_and_compute_the_same(tiny, prompt_300):
    """consume_weights empties the caller's dict of what it binds (so fused parts on the device
    are not kept alive by it), keeps what it does not bind, and changes no result."""
    config = TextConfig.from_hf(tiny.hf_config)
    mine = {**tiny.weights, "mtp.fc.weight": torch.zeros(2, 2)}
    consumed = Qwen3_5Model(config, mine, strict=False, fuse_projections=True, consume_weights=True)
    assert list(mine) == ["mtp.fc.weight"]
    kept = Qwen3_5Model(config, tiny.weights, fuse_projections=True)
    rows = []
    for model in (consumed, kept):
        rows.append(prefill(model, new_cache(config), prompt_300[:20], pages=[0, 1, 2], slot=0))
    assert torch.equal(rows[0], rows[1])
    with pytest.raises(TypeError, match="mutable mapping"):
        Qwen3_5Model(config, MappingProxyType(dict(tiny.weights)), consume_weights=True)


def test_batch_beyond_page_table_is_rejected(tiny_dense):
    model, config = make(tiny_dense)
    with pytest.raises(BatchError, match="page table capacity"):
        prefill(model, new_cache(config), list(range(20)), pages=[0], slot=0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_cuda_matches_cpu(tiny, prompt_300, dtype):
    """The reference path runs unchanged on CUDA (chunked prefill, then a 2-sequence decode)."""
    results = {}
    for device in ("cpu", "cuda"):
        config = TextConfig.from_hf(tiny.hf_config)
        model = Qwen3_5Model(config, tiny.weights, dtype=dtype, device=device)
        cache = ModelCache.allocate(
            config, num_pages=64, num_slots=4, page_size=PAGE_SIZE, dtype=dtype, device=device
        )
        pool = shuffled_pages(64, seed=2)
        tables = [pool[:8], pool[8:16]]
        rows = []
        for b, (start, slot) in enumerate([(0, 1), (100, 3)]):
            for chunk_start in (0, 50):
                piece = prompt_300[start + chunk_start : start + chunk_start + 50]
                batch = ForwardBatch.prefill(
                    piece,
                    num_computed=chunk_start,
                    page_ids=tables[b],
                    state_slot=slot,
                    device=device,
                )
                rows.append(model.forward(batch, cache, all_logits=True).cpu())
        for s in range(4):
            batch = ForwardBatch.decode(
                [s, s + 1],
                num_computed=[100 + s] * 2,
                page_tables=tables,
                state_slots=[1, 3],
                device=device,
            )
            rows.append(model.forward(batch, cache).cpu())
        results[device] = torch.cat(rows)
    row_err = (results["cuda"] - results["cpu"]).abs().amax(-1) / results["cpu"].abs().amax(-1)
    print(f"cuda vs cpu {dtype}: median row error {row_err.median():.2e}, max {row_err.max():.2e}")
    assert row_err.median().item() < (1e-3 if dtype == torch.float32 else 3e-2)


@pytest.mark.gpu
def test_cuda_decode_step_is_graph_capturable(tiny, prompt_300):
    """No host sync on the decode path: a captured step replays to the eager step's logits."""
    config = TextConfig.from_hf(tiny.hf_config)
    model = Qwen3_5Model(config, tiny.weights, device="cuda")
    pages = [[3, 9], [5, 0]]
    slots = [2, 1]

    def fresh_cache() -> ModelCache:
        cache = ModelCache.allocate(
            config,
            num_pages=16,
            num_slots=4,
            page_size=PAGE_SIZE,
            dtype=torch.float32,
            device="cuda",
        )
        for b in range(2):
            batch = ForwardBatch.prefill(
                prompt_300[b * 20 : b * 20 + 20],
                num_computed=0,
                page_ids=pages[b],
                state_slot=slots[b],
                device="cuda",
            )
            model.forward(batch, cache)
        return cache

    def step_batch() -> ForwardBatch:
        return ForwardBatch.decode(
            [7, 8], num_computed=[20, 20], page_tables=pages, state_slots=slots, device="cuda"
        )

    eager = model.forward(step_batch(), fresh_cache()).cpu()
    cache = fresh_cache()
    snapshot = [t.clone() for t in cache.conv_state + cache.ssm_state]
    batch = step_batch()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        model.forward(batch, cache)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = model.forward(batch, cache)
    for t, saved in zip(cache.conv_state + cache.ssm_state, snapshot, strict=True):
        t.copy_(saved)  # undo the warm-up step; KV rewrites are idempotent
    graph.replay()
    torch.cuda.synchronize()
    assert rel_err(logits.cpu(), eager) < 1e-5


def test_moe_router_and_shared_expert_in_one_gemm(tiny_moe, prompt_300, monkeypatch) -> None:
    """Where the shared expert runs outside the expert kernels (grouped steps; here forced with
    `shared_expert_in_kernels` off), the router, the shared gate and the shared gate-up are one
    GEMM over `router_gate_shared` in every MoE layer; with `router_shared_gemm` in
    NINFER_KERNELS_OFF they are apart again; the same step either way (< 1e-5 relative: the same
    products, other GEMM calls)."""
    from ninfer.kernels import dispatch

    config = TextConfig.from_hf(tiny_moe.hf_config)
    model = Qwen3_5Model(config, tiny_moe.weights, fuse_projections=True)
    whole = {id(layer.ffn.router_gate_shared) for layer in model.layers}
    assert None not in whole and len(whole) == len(model.layers)
    linear = dispatch.linear
    used: list[bool] = []

    def spy(x, weight, *a, **kw):
        used.append(id(weight) in whole)
        return linear(x, weight, *a, **kw)

    monkeypatch.setattr(dispatch, "linear", spy)
    rows = {}
    for off in ("", "router_shared_gemm"):
        monkeypatch.setenv("NINFER_KERNELS_OFF", f"shared_expert_in_kernels,{off}")
        used.clear()
        cache = new_cache(config)
        pages = shuffled_pages(pages_for(21), seed=5)
        out = [prefill(model, cache, prompt_300[:20], pages=pages, slot=1)]
        out.append(decode(model, cache, [9], num_computed=[20], pages=[pages], slots=[1]))
        rows[off] = torch.cat(out)
        # two forwards (prefill, decode), one such GEMM per layer each, or none
        assert sum(used) == (0 if off else 2 * len(model.layers))
    assert rel_err(rows[""], rows["router_shared_gemm"]) < 1e-5
