"""Speculative decoding with the MTP head on CUDA: greedy output equals plain decoding.

Tiny converted models (conftest.py), fp32 without TF32: spec="mtp" (eager rounds on the GPU
kernels: per-column DeltaNet decode kernels in the verify, the sampling twin for acceptance)
against the plain engine (CUDA-graph decode), token for token, for k = 1, 3, 5, dense and MoE,
batched, with the head's own drafts and with oracle drafts (every acceptance length occurs).
bf16 is checked separately: there the verify's GEMMs (k + 1 rows per sequence) and the decode
step's round differently, so on these flat random logits a near-tie can flip an argmax, after
which the continuations legitimately differ. So spec and plain bf16 must agree up to their first
divergence only, and there the two tokens must be a near-tie of the fp32 logits (an independent
forward of the artifact's model, no engine) within twice the measured bf16 noise; one request
must agree for 16 tokens, so the check cannot pass vacuously. The bench core runs once on the
tiny synthetic model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ninfer import Engine
from ninfer.artifact.reader import Artifact
from ninfer.engine.handles import RequestHandle
from ninfer.engine.request import EventKind
from ninfer.model import ForwardBatch, ModelCache, Qwen3_5Model, TextConfig
from support.spec_engines import ChainCount, OracleDrafts

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


# The near-tie reference runs torch's CPU path: independent of the engine and its CUDA kernels
# (any device works; the tiny model costs well under a second per forward there).
REF_DEVICE = "cpu"
MIN_AGREEMENT = 16  # some request must agree this long: a check that always diverges at 0 is void


def _first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def _next_logits(artifact: Path, ids: list[int], dtype: torch.dtype, device: str) -> torch.Tensor:
    """fp32 logits [vocab] for the token after `ids`: the artifact's text model bound directly in
    `dtype` on `device`, one prefill of all of `ids`."""
    with Artifact(artifact) as art:
        config = TextConfig.from_hf(art.config["text"])
        model = Qwen3_5Model(config, art.load("text"), dtype=dtype, device=device)
        pages = list(range(-(-len(ids) // 16)))
        cache = ModelCache.allocate(config, num_pages=len(pages), num_slots=1, page_size=16,
                                    dtype=dtype, device=device)  # fmt: skip
        batch = ForwardBatch.prefill(ids, num_computed=0, page_ids=pages, state_slot=0,
                                     device=device)  # fmt: skip
        return model.forward(batch, cache)[0].float().cpu()


def _tie_gap_and_noise(
    artifact: Path, ids: list[int], a: int, b: int, device: str = REF_DEVICE
) -> tuple[float, float]:
    """(|l32[a] - l32[b]|, bf16 noise) for candidates `a`, `b` of the token after `ids`: l32 are
    the fp32 logits; the noise is the largest |l_bf16 - l32| over a, b and the 16 best fp32
    tokens, l_bf16 from the same model bound in bf16 (what bf16 rounding moves a logit by)."""
    l32 = _next_logits(artifact, ids, torch.float32, device)
    l16 = _next_logits(artifact, ids, torch.bfloat16, device)
    watched = torch.cat([l32.topk(16).indices, torch.tensor([a, b])])
    noise = (l16 - l32).abs()[watched].max().item()
    return abs(l32[a] - l32[b]).item(), noise


def test_spec_greedy_bf16(artifact: Path, plain) -> None:
    """bf16 spec (oracle drafts, k = 3) against plain bf16: equal up to the first divergence; at
    it, the spec token b and the plain token a must be a near-tie in fp32: |l32[a] - l32[b]| <=
    2 * noise + 1e-3. Why 2 * noise: plain picked a, so its bf16 logits have l(a) >= l(b), and
    spec's have l(b) >= l(a); if every bf16 logit is within `noise` of fp32, then l32[a] and
    l32[b] lie within 2 * noise of each other (`noise` comes from a one-shot bf16 prefill of the
    same prefix: an estimate of the engines' bf16 error, not their own numbers). 1e-3 absorbs
    the fp32 reference's own rounding (other GEMM shapes than the engines'). A real bug picks a
    token far from the top instead.
    Tokens after a request's first divergence follow different prefixes and are not compared."""
    with _engine(artifact, spec="mtp", draft_tokens=3, dtype="bf16") as engine:
        OracleDrafts(engine, {rid: PROMPTS[rid] + t for rid, t in plain["bf16"].items()})
        got = _run(engine, PROMPTS, MAX_TOKENS)
    agreed, examined = {}, []
    for rid, events in got.items():
        spec, ref = _tokens(events), plain["bf16"][rid]
        assert len(spec) == len(ref) == MAX_TOKENS, rid
        i = _first_divergence(spec, ref)
        agreed[rid] = MAX_TOKENS if i is None else i
        if i is None:
            continue
        assert spec[:i] == ref[:i], rid
        examined.append(rid)
        gap, noise = _tie_gap_and_noise(artifact, PROMPTS[rid] + ref[:i], ref[i], spec[i])
        assert gap <= 2 * noise + 1e-3, (
            f"{rid}: token {i}: spec {spec[i]} vs plain {ref[i]} is no bf16 near-tie: "
            f"fp32 logit gap {gap:.4g} > 2 * noise {noise:.4g} + 1e-3"
        )
    assert len(examined) == len(set(examined)), examined  # one divergence per request at most
    assert max(agreed.values()) >= MIN_AGREEMENT, agreed


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
        # the pieces are timed as the round's graph runs them: captured, and a part of it
        assert r["eager_pieces"] == []
        assert r["verify_ms"] < r["round_ms"]


def test_spec_with_lm_head_draft_equals_plain_fp32(artifact: Path, plain) -> None:
    with _engine(artifact, spec="mtp", draft_tokens=3, lm_head_draft=True) as engine:
        got = _run(engine, PROMPTS, MAX_TOKENS)
    for rid, events in got.items():
        assert _tokens(events) == plain["fp32"][rid], rid


def test_chained_rounds_in_graphs_equal_plain_fp32(artifact: Path, plain) -> None:
    """Chained rounds through the captured round graphs (t0, position, RNG step and counts from
    the device feed, the previous round folded with device column counts): plain tokens, with
    oracle drafts so every acceptance length occurs, and the rounds really chained."""
    with _engine(artifact, spec="mtp", draft_tokens=3) as engine:
        OracleDrafts(engine, {rid: PROMPTS[rid] + t for rid, t in plain["fp32"].items()})
        chained = ChainCount(engine)
        got = _run(engine, PROMPTS, MAX_TOKENS)
        graphs, status = engine.core.runner.spec.use_graphs, engine.graph_status
    for rid, events in got.items():
        assert _tokens(events) == plain["fp32"][rid], rid
    assert chained.rows > 0
    # the rounds replayed captured graphs where the model allows them (the dense one)
    assert graphs == (status == "on") and (graphs or "moe" in str(artifact)), status


def test_chained_sampled_penalized_rounds_equal_unchained(artifact: Path) -> None:
    """Seeded sampling with penalties: chained rounds (graphs) give what unchained ones give."""
    kw = {"max_tokens": 30, "ignore_eos": True, "temperature": 0.9, "top_p": 0.95,
          "presence_penalty": 0.7, "frequency_penalty": 0.4}  # fmt: skip
    outs, chained = {}, {}
    for no_overlap in (False, True):
        with _engine(artifact, spec="mtp", draft_tokens=3, no_overlap=no_overlap) as engine:
            seen = ChainCount(engine)
            handles = {
                rid: RequestHandle(
                    engine.core, engine.make_request(p, request_id=rid, seed=40 + i, **kw)
                )
                for i, (rid, p) in enumerate(PROMPTS.items())
            }
            outs[no_overlap] = {rid: _tokens(list(h)) for rid, h in handles.items()}
        chained[no_overlap] = seen.rows
    assert chained[False] > 0 and chained[True] == 0
    assert outs[False] == outs[True]
