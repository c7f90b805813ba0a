"""The context cache on CUDA: copies are stream-ordered (a host snapshot enqueued before a kernel
that overwrites its source still holds the old values; a restore enqueued before a kernel that
reads its destination is seen by it), a prefix hit equals the cold run with CUDA graphs and the
overlapped loop on, and paused = unpaused by both routes (pinned host snapshots, replay).
Tiny converted models (conftest.py); greedy tokens must be identical, logits bit-identical where
the cold run splits its chunks at the same offset."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ninfer import Engine
from ninfer.engine.copies import CopyEngine
from ninfer.engine.handles import RequestHandle
from ninfer.engine.plan import PAGES, STATE, CopyOp
from ninfer.engine.request import EventKind, FinishReason
from ninfer.model.cache import ModelCache
from ninfer.model.config import TextConfig

pytestmark = pytest.mark.gpu
VOCAB = 8192
BASE = {"page_size": 16, "max_context": 512, "prefill_chunk": 32, "device": "cuda:0"}


def _prompt(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def _tokens(engine: Engine, ids: list[int], **kw) -> tuple[list[int], object]:
    request = engine.make_request(ids, ignore_eos=True, greedy=True, **kw)
    events = list(RequestHandle(engine.core, request))
    return [t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids], events[-1]


def test_copies_are_ordered_with_the_kernels_around_them(dense_artifact: Path) -> None:
    with Engine.load(dense_artifact, **BASE) as engine:
        config: TextConfig = engine.config
    cache = ModelCache.allocate(
        config, num_pages=8, num_slots=4, page_size=16, dtype=torch.bfloat16, device="cuda:0"
    )
    copies = CopyEngine(cache, torch.device("cuda:0"))
    tensors = [*cache.conv_state, *cache.ssm_state, *cache.k_pages, *cache.v_pages]
    for t in tensors:
        t.normal_()
    want_state = [t[1].clone() for t in [*cache.conv_state, *cache.ssm_state]]
    want_pages = [t[[2, 5]].clone() for t in [*cache.k_pages, *cache.v_pages]]
    torch.cuda.synchronize()
    # to the host, then overwrite the sources on the same stream before anyone waits
    copies.run(
        [
            CopyOp(STATE, (1,), (0,), dst_host=True),
            CopyOp(PAGES, (2, 5), (1,), dst_host=True),
        ]
    )
    for t in tensors:
        t.mul_(0.0).add_(7.0)
    # back into other places, then read them in a kernel enqueued after the copies
    copies.run(
        [CopyOp(STATE, (0,), (3,), src_host=True), CopyOp(PAGES, (1,), (6, 7), src_host=True)]
    )
    state = [t[3].clone() for t in [*cache.conv_state, *cache.ssm_state]]
    pages = [t[[6, 7]].clone() for t in [*cache.k_pages, *cache.v_pages]]
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(state, want_state, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(pages, want_pages, strict=True))
    assert all(t.is_pinned() for block in copies.host.values() for t in block)


@pytest.mark.parametrize("cut", [64, 63, 65])
def test_a_hit_equals_the_cold_run_with_graphs(dense_artifact: Path, cut: int) -> None:
    stem = _prompt(cut, 100)
    second = stem[:cut] + _prompt(1000 + cut, 9)
    with Engine.load(dense_artifact, dtype="bf16", **BASE) as warm:
        assert warm.graph_status == "on"
        _tokens(warm, stem, max_tokens=4, cache_checkpoints=(cut,))
        hit, done = _tokens(warm, second, max_tokens=24, cache_checkpoints=(cut,))
        assert done.num_cached == cut
    with Engine.load(dense_artifact, dtype="bf16", **BASE) as cold:
        want, _ = _tokens(cold, second, max_tokens=24, cache_checkpoints=(cut,))
    assert hit == want


@pytest.mark.parametrize("host_context_mib", [None, 0], ids=["snapshot", "replay"])
def test_paused_equals_unpaused_on_cuda(dense_artifact: Path, host_context_mib) -> None:
    prompts = [_prompt(50 + i, 40 + 9 * i) for i in range(4)]
    with Engine.load(dense_artifact, dtype="fp32", max_concurrency=1, **BASE) as solo:
        want = [_tokens(solo, p, max_tokens=96)[0] for p in prompts]
    with Engine.load(
        dense_artifact,
        dtype="fp32",
        max_concurrency=4,
        kv_capacity=256,  # 16 pages; each request ends at 136..163 tokens (9..11 pages)
        host_context_mib=host_context_mib,
        **BASE,
    ) as engine:
        handles = [
            RequestHandle(engine.core, engine.make_request(p, max_tokens=96, ignore_eos=True,
                                                           greedy=True))
            for p in prompts
        ]  # fmt: skip
        results = [list(h) for h in handles]
        sched = engine.core.scheduler
        assert sched.num_preemptions >= 4
        if host_context_mib is None:
            assert sched.num_snapshot_restores > 0
        else:
            assert sched.num_replay_restores > 0
    for events, tokens in zip(results, want, strict=True):
        assert events[-1].finish_reason == FinishReason.LENGTH
        assert [t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids] == tokens


def test_bench_context_cache_on_a_tiny_model(dense_artifact: Path) -> None:
    from ninfer.artifact.reader import Artifact
    from ninfer.bench.context_cache import run_context_cache
    from ninfer.model.qwen3_5 import Qwen3_5Model

    with Artifact(dense_artifact) as art:
        config = TextConfig.from_hf(art.config["text"])
        model = Qwen3_5Model(config, art.load("text"), dtype=torch.bfloat16, device="cuda:0")
    result = run_context_cache(
        model, "qwen3.6-27b", turn_tokens=1024, snapshot_tokens=2048, prefill_chunk=256,
        on_progress=lambda msg: None,
    )  # fmt: skip
    assert result.cached_tokens >= 1024 - 5 and result.second_turn_prompt > 1024
    assert 0 < result.warm_ttft_ms < result.cold_ttft_ms
    assert result.snapshot_ms > 0 and result.restore_ms > 0
    assert result.snapshot_bytes > 2048 * ModelCache.bytes_per_page(config, 1, torch.bfloat16)
