"""Speculative decoding with the MTP head on CUDA: greedy output equals plain decoding.

Tiny converted models (conftest.py), fp32 without TF32: spec="mtp" (eager rounds on the GPU
kernels: per-column DeltaNet decode kernels in the verify, the sampling twin for acceptance)
against the plain engine (CUDA-graph decode), token for token, for k = 1, 3, 5, dense and MoE,
batched, with the head's own drafts and with oracle drafts (every acceptance length occurs).
bf16 is checked separately: there the verify's GEMMs (k + 1 rows per sequence) and the decode
step's round differently, so a near-tie could flip an argmax; a failure there is worth a look
at the logits before calling it a bug. The bench core runs once on the tiny synthetic model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ninfer import Engine
from ninfer.engine.handles import RequestHandle
from ninfer.engine.request import EventKind
from support.spec_engines import OracleDrafts

pytestmark = pytest.mark.gpu
VOCAB = 8192
GREEDY = {"greedy": True, "presence_penalty": 0.0}


def _prompt(i: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(500 + i)
    return torch.randint(0, VOCAB, (n,), generator=g).tolist()


def _engine(path: Path, **options) -> Engine:
    base = {"max_concurrency": 3, "page_size": 16, "max_context": 256, "prefill_chunk": 32,
            "device": "cuda", "dtype": "fp32"}  # fmt: skip
    return Engine.load(path, **(base | options))


def _run(engine: Engine, prompts: dict[str, list[int]], max_tokens: int) -> dict[str, list]:
    handles = {
        rid: RequestHandle(
            engine.core,
            engine.make_request(
                p, max_tokens=max_tokens, ignore_eos=True, request_id=rid, **GREEDY
            ),  # fmt: skip
        )
        for rid, p in prompts.items()
    }
    return {rid: list(h) for rid, h in handles.items()}


def _tokens(events: list) -> list[int]:
    return [t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids]


PROMPTS = {f"r{i}": _prompt(i, 20 + 9 * i) for i in range(3)}
MAX_TOKENS = 40


@pytest.fixture(scope="module", params=["dense", "moe"])
def artifact(request: pytest.FixtureRequest, dense_artifact: Path, moe_artifact: Path) -> Path:
    return dense_artifact if request.param == "dense" else moe_artifact


@pytest.fixture(scope="module")
def plain(artifact: Path) -> dict[str, dict[str, list[int]]]:
    out = {}
    for dtype in ("fp32", "bf16"):
        with _engine(artifact, dtype=dtype) as engine:
            out[dtype] = {rid: _tokens(ev) for rid, ev in _run(engine, PROMPTS, MAX_TOKENS).items()}
    return out


@pytest.mark.parametrize("oracle", [False, True], ids=["head", "oracle"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_spec_greedy_equals_plain_fp32(artifact: Path, plain, k: int, oracle: bool) -> None:
    with _engine(artifact, spec="mtp", draft_tokens=k) as engine:
        if oracle:
            OracleDrafts(engine, {rid: PROMPTS[rid] + t for rid, t in plain["fp32"].items()})
        got = _run(engine, PROMPTS, MAX_TOKENS)
    for rid, events in got.items():
        assert _tokens(events) == plain["fp32"][rid], rid
        s = events[-1].stats.speculative
        assert s["rounds"] > 0 and s["drafted_tokens"] == k * s["rounds"]
        if oracle:
            assert s["accepted_tokens"] > 0


def test_spec_greedy_bf16(artifact: Path, plain) -> None:
    with _engine(artifact, spec="mtp", draft_tokens=3, dtype="bf16") as engine:
        OracleDrafts(engine, {rid: PROMPTS[rid] + t for rid, t in plain["bf16"].items()})
        got = _run(engine, PROMPTS, MAX_TOKENS)
    for rid, events in got.items():
        assert _tokens(events) == plain["bf16"][rid], rid


def test_spec_bench_core_on_the_gpu() -> None:
    from ninfer.bench.spec_bench import run_spec_bench
    from ninfer.bench.synthetic import random_mtp_weights, random_weights, synthetic_config
    from ninfer.model.mtp import MtpHead
    from ninfer.model.qwen3_5 import Qwen3_5Model

    config = synthetic_config("tiny-dense")
    model = Qwen3_5Model(config, random_weights("tiny-dense", device="cuda"), device="cuda",
                         dtype=torch.bfloat16)  # fmt: skip
    head = MtpHead(model, random_mtp_weights("tiny-dense", device="cuda"))
    report = run_spec_bench(model, head, architecture="qwen3_5", draft_tokens=3, batches=(1, 4),
                            context=256, prompt_tokens=64, output_tokens=32, steps=4)  # fmt: skip
    for r in report["rows"]:
        assert r["rounds"] > 0 and r["round_ms"] > 0 and r["plain_decode_ms"] > 0


def test_spec_with_lm_head_draft_equals_plain_fp32(artifact: Path, plain) -> None:
    with _engine(artifact, spec="mtp", draft_tokens=3, lm_head_draft=True) as engine:
        got = _run(engine, PROMPTS, MAX_TOKENS)
    for rid, events in got.items():
        assert _tokens(events) == plain["fp32"][rid], rid
