"""Speculative decoding with the MTP head on the real engine and tiny models (CPU, fp32).

Greedy output with spec="mtp" must equal greedy output without it, token for token: for every k,
dense and MoE, alone and batched, with real head drafts (random weights: almost all rejected) and
with oracle drafts (conftest.OracleDrafts: every acceptance length occurs), with stops, EOS and
max_tokens ending inside a round, with a prefix hit on a conversation that stopped inside a
round, and under forced preemption (snapshot and replay). Usage counts committed tokens only,
and the request's speculative counters add up.
"""

from __future__ import annotations

import pytest

from ninfer.engine.request import EventKind, FinishReason
from support.spec_engines import OracleDrafts, prompt, run_requests, tokens

MAX_TOKENS = 14
GREEDY = {"greedy": True}


def _requests(n: int, **kw) -> dict[str, tuple[list[int], dict]]:
    base = {"max_tokens": MAX_TOKENS, "ignore_eos": True, **GREEDY}
    return {f"r{i}": (prompt(i), {**base, **kw}) for i in range(n)}


@pytest.fixture(scope="module")
def baseline(tiny) -> dict[str, list[int]]:
    """Each request alone on a plain engine: the reference tokens."""
    reqs = _requests(3)
    with tiny.engine(max_concurrency=1) as engine:
        out = {}
        for rid, r in reqs.items():
            out.update({k: tokens(v) for k, v in run_requests(engine, {rid: r}).items()})
    return out


def _truth(baseline: dict[str, list[int]]) -> dict[str, list[int]]:
    return {rid: prompt(int(rid[1:])) + toks for rid, toks in baseline.items()}


@pytest.mark.parametrize(
    ("k", "static"),
    [(1, False), (2, False), (3, False), (4, False), (5, False), (2, True), (5, True)],
)
def test_greedy_spec_equals_plain_oracle_drafts_batched(tiny, baseline, k, static) -> None:
    """`static`: rounds over the padded static buffers (the CUDA-graph body, run eagerly):
    three rows in a bucket of four, attention lengths from the device."""
    lanes = 5 if static else 3  # buckets 1, 2, 4, 5: three rows replay bucket 4, one padded
    with tiny.engine(
        spec="mtp", draft_tokens=k, max_concurrency=lanes, static_rounds=static
    ) as engine:
        assert engine.core.runner.spec.static == static
        OracleDrafts(engine, _truth(baseline))
        got = run_requests(engine, _requests(3))
    for rid, events in got.items():
        assert tokens(events) == baseline[rid], rid
        end = events[-1]
        assert end.finish_reason == FinishReason.LENGTH
        assert end.usage.completion_tokens == MAX_TOKENS
        s = end.stats.speculative
        assert s["backend"] == "mtp" and s["draft_window"] == k
        assert s["drafted_tokens"] == k * s["rounds"]
        assert sum(s["accepted_per_position"]) == s["accepted_tokens"]
        timings = end.timings.to_dict()  # llama.cpp-compatible: draft_n, draft_n_accepted
        assert timings["draft_n"] == s["drafted_tokens"]
        assert timings["draft_n_accepted"] == s["accepted_tokens"]
        per = s["accepted_per_position"]
        assert all(a >= b for a, b in zip(per, per[1:], strict=False))
        # every committed token but the prefill's came from a round (a + 1) or a fallback step;
        # the last round may have been cut by max_tokens
        full = s["rounds"] + s["accepted_tokens"] + s["fallback_steps"] + 1
        assert MAX_TOKENS <= full < MAX_TOKENS + k + 1
    accepted = sum(e[-1].stats.speculative["accepted_tokens"] for e in got.values())
    drafted = sum(e[-1].stats.speculative["drafted_tokens"] for e in got.values())
    assert 0 < accepted < drafted  # both branches of the acceptance ran


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_spec_equals_plain_real_head_alone(tiny, baseline, k) -> None:
    with tiny.engine(spec="mtp", draft_tokens=k, max_concurrency=1) as engine:
        for rid, r in _requests(2).items():
            events = run_requests(engine, {rid: r})[rid]
            assert tokens(events) == baseline[rid], rid


def test_stops_inside_a_round_commit_exactly_the_prefix(dense) -> None:
    """Oracle drafts that are always right: every round accepts k, so stop ids, stop strings
    and max_tokens fall inside rounds. Output, finish reason and usage equal the plain run's."""
    p = prompt(7, 12)
    with dense.engine(max_concurrency=1) as plain:
        kw = {"max_tokens": 30, "ignore_eos": True, **GREEDY}
        ref = tokens(run_requests(plain, {"a": (p, kw)})["a"])
        text = plain.tokenizer.decode(ref[6:8])
        cases = {
            "limit": {"max_tokens": 6},
            "stop_id": {"max_tokens": 30, "stop_token_ids": frozenset({ref[4]})},
            "stop_string": {"max_tokens": 30, "stop": [text] if text.strip() else []},
        }
        want = {
            name: run_requests(plain, {name: (p, {**GREEDY, "ignore_eos": True, **kw})})[name]
            for name, kw in cases.items()
        }
    with dense.engine(spec="mtp", draft_tokens=4, max_concurrency=1) as engine:
        OracleDrafts(engine, dict.fromkeys(cases, p + ref), wrong=lambda pos, j: False)
        for name, kw in cases.items():
            got = run_requests(engine, {name: (p, {**GREEDY, "ignore_eos": True, **kw})})[name]
            assert tokens(got) == tokens(want[name]), name
            assert "".join(e.text for e in got) == "".join(e.text for e in want[name]), name
            assert got[-1].finish_reason == want[name][-1].finish_reason, name
            assert got[-1].usage == want[name][-1].usage, name
            assert got[-1].stats.speculative["accepted_tokens"] > 0, name


def test_prefix_hit_after_a_stop_inside_a_round(dense) -> None:
    """A conversation that stopped on a draft inside a round leaves its end as a checkpoint;
    the state captured there (rewound from the verify's records) must be exact: a follow-up
    turn reusing it decodes exactly what a plain engine decodes."""
    p = prompt(8, 12)
    with dense.engine(max_concurrency=1) as plain:
        kw = {"max_tokens": 30, "ignore_eos": True, **GREEDY}
        ref = tokens(run_requests(plain, {"a": (p, kw)})["a"])
    # the first round accepts d1..d4 = ref[1..4]: a stop on ref[3] ends on a fed draft
    stop = {"max_tokens": 30, "ignore_eos": True, "stop_token_ids": frozenset({ref[3]}), **GREEDY}
    first = ref[: ref.index(ref[3]) + 1]
    follow = p + first + prompt(9, 5)
    with dense.engine(no_prefix_reuse=True, max_concurrency=1) as plain:
        want = tokens(run_requests(plain, {"b": (follow, {"max_tokens": 12, **GREEDY})})["b"])
    with dense.engine(spec="mtp", draft_tokens=4, max_concurrency=1) as engine:
        OracleDrafts(engine, {"a": p + ref}, wrong=lambda pos, j: False)
        got_a = run_requests(engine, {"a": (p, stop)})["a"]
        assert tokens(got_a) == first
        assert got_a[-1].stats.speculative["accepted_tokens"] > 0
        assert engine.core.scheduler.num_spec_rewinds == 1
        got_b = run_requests(engine, {"b": (follow, {"max_tokens": 12, **GREEDY})})["b"]
        assert got_b[-1].num_cached == len(p) + len(first)  # the stopped turn was reused whole
        assert tokens(got_b) == want


@pytest.mark.parametrize("host_context_mib", [None, 0], ids=["snapshot", "replay"])
def test_preemption_with_spec(dense, host_context_mib) -> None:
    """Four requests over a pool that holds about two: the youngest pause and resume (host
    snapshot or replay) between rounds, and every request still gets its solo tokens."""
    reqs = {f"p{i}": (prompt(20 + i, 18 + 3 * i), {"max_tokens": 30, "ignore_eos": True,
            **GREEDY}) for i in range(4)}  # fmt: skip
    with dense.engine(max_concurrency=1) as plain:
        want = {rid: tokens(run_requests(plain, {rid: r})[rid]) for rid, r in reqs.items()}
    with dense.engine(
        spec="mtp",
        draft_tokens=2,
        max_concurrency=4,
        kv_capacity=112,
        host_context_mib=host_context_mib,
    ) as engine:
        truth = {rid: r[0] + want[rid] for rid, r in reqs.items()}
        OracleDrafts(engine, truth)
        got = run_requests(engine, reqs)
        preemptions = engine.core.scheduler.num_preemptions
    assert preemptions > 0
    for rid in reqs:
        assert tokens(got[rid]) == want[rid], rid


def test_seeded_sampling_with_spec_does_not_depend_on_batching(dense) -> None:
    sampled = {"temperature": 0.8, "top_p": 0.95, "presence_penalty": 0.4}
    kw = {"max_tokens": 12, "ignore_eos": True, **sampled}
    reqs = {f"s{i}": (prompt(30 + i, 10 + 3 * i), {**kw, "seed": 70 + i}) for i in range(3)}
    with dense.engine(spec="mtp", draft_tokens=3, max_concurrency=1) as engine:
        solo = {rid: tokens(run_requests(engine, {rid: r})[rid]) for rid, r in reqs.items()}
    with dense.engine(spec="mtp", draft_tokens=3, max_concurrency=3) as engine:
        batched = {rid: tokens(ev) for rid, ev in run_requests(engine, reqs).items()}
    assert batched == solo
    assert all(len(t) == 12 for t in solo.values())


def test_context_end_falls_back_to_single_steps(dense) -> None:
    """Near max_context a round no longer fits (L + 2k + 1 > max_context): fallback steps
    decode to the end, with the plain engine's tokens and finish reason."""
    p = prompt(40, 100)
    kw = {"max_tokens": 40, "ignore_eos": True, **GREEDY}
    with dense.engine(max_concurrency=1) as plain:
        want = run_requests(plain, {"c": (p, kw)})["c"]
    with dense.engine(spec="mtp", draft_tokens=3, max_concurrency=1) as engine:
        got = run_requests(engine, {"c": (p, kw)})["c"]
    assert tokens(got) == tokens(want)
    assert got[-1].finish_reason == want[-1].finish_reason == FinishReason.CONTEXT
    s = got[-1].stats.speculative
    assert 1 <= s["fallback_steps"] <= 2 * 3 + 1 and s["rounds"] > 0
    assert [e for e in got if e.kind == EventKind.TOKENS]


def test_thinking_budget_ending_inside_a_round() -> None:
    """The demo artifact (the real vocabulary, so `</think>` exists): a budget of 3 thinking
    tokens ends inside the first round (k = 3, oracle drafts always right); the control suffix
    replaces the rest of the round, and the output equals the plain engine's."""
    from ninfer.artifact.demo import ensure_demo
    from support.spec_engines import bind_artifact

    demo = bind_artifact(ensure_demo())
    try:
        p = demo.tokenizer.encode_template(
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
        )
        kw = {"max_tokens": 36, "thinking_budget": 3, **GREEDY}
        with demo.engine(max_context=256, prefill_chunk=64) as plain:
            want = run_requests(plain, {"t": (p, kw)})["t"]
            free = tokens(run_requests(plain, {"f": (p, {"max_tokens": 8, **GREEDY})})["f"])
        with demo.engine(max_context=256, prefill_chunk=64, spec="mtp", draft_tokens=3) as engine:
            # before the cap: the free run's tokens; after it the drafts are simply wrong
            OracleDrafts(engine, {"t": p + free}, wrong=lambda pos, j: False)
            got = run_requests(engine, {"t": (p, kw)})["t"]
            rewinds = engine.core.scheduler.num_spec_rewinds
        assert tokens(got) == tokens(want)
        assert rewinds == 1  # the suffix replaced d3 (accepted): the state went back a column
        assert got[-1].usage == want[-1].usage
        assert got[-1].stats.speculative["accepted_tokens"] >= 3
    finally:
        demo.artifact.close()


def test_spec_needs_the_artifacts_mtp_head_and_options_are_checked(tmp_path) -> None:
    from ninfer import Engine
    from ninfer.testing import TinySpec
    from support.tiny_artifacts import convert_tiny

    spec = TinySpec(kind="dense", vocab_size=1024, with_vision=False, with_mtp=False)
    _, path = convert_tiny(tmp_path, spec, seed=1, name="no-mtp")
    with pytest.raises(ValueError, match="the artifact has no MTP head"):
        Engine.load(path, spec="mtp", dtype="fp32")
    for bad, needle in (
        ({"spec": "dflash"}, "spec must be 'mtp'"),
        ({"spec": "mtp", "draft_tokens": 6}, "draft_tokens must be in 1..5"),
        ({"draft_tokens": 2}, "draft_tokens needs spec"),
        ({"lm_head_draft": True}, "lm_head_draft needs spec"),
    ):
        with pytest.raises(ValueError, match=needle):
            Engine.load(path, dtype="fp32", **bad)
