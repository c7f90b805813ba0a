"""Chained rounds: a sequence's next round planned and launched while its round is in flight.

The chained row reads t0, its position and the fold of the round before it on the device
(`SpecStep._take_feed`, `fold_latest` with the device's column counts), so the host never waits
for a round before launching the next. Greedy output must still equal the plain engine's token
for token, eager and static, alone and batched, with every acceptance length (oracle drafts) and
with a stop id ending inside a round whose successor was already launched. Requests that must
not chain (sampled, stop strings, a waiting request) never do.
"""

from __future__ import annotations

import pytest

from ninfer.engine.handles import RequestHandle
from support.spec_engines import ChainCount, OracleDrafts, prompt, run_requests, tokens

GREEDY = {"greedy": True, "ignore_eos": True}


def _requests(n: int, max_tokens: int = 24) -> dict[str, tuple[list[int], dict]]:
    return {
        f"c{i}": (prompt(50 + i, 9 + 4 * i), {"max_tokens": max_tokens, **GREEDY}) for i in range(n)
    }


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
@pytest.mark.parametrize("batch", [1, 3])
def test_chained_rounds_equal_plain_decoding(tiny, static, batch) -> None:
    reqs = _requests(batch)
    with tiny.engine(max_concurrency=1) as plain:
        want = {rid: tokens(run_requests(plain, {rid: r})[rid]) for rid, r in reqs.items()}
    truth = {rid: r[0] + want[rid] for rid, r in reqs.items()}
    with tiny.engine(
        spec="mtp", draft_tokens=3, max_concurrency=batch, static_rounds=static
    ) as engine:
        OracleDrafts(engine, truth)  # every acceptance length 0..3 occurs
        count = ChainCount(engine)
        got = run_requests(engine, reqs)
        engine.core.scheduler.check_integrity()
    assert {rid: tokens(ev) for rid, ev in got.items()} == want
    assert count.rows > 0
    rounds = sum(ev[-1].stats.speculative["rounds"] for ev in got.values())
    assert count.rows < rounds  # the first round of each request (after prefill) is not chained
    for ev in got.values():  # only landed rounds count (the last may be cut by max_tokens)
        s = ev[-1].stats.speculative
        full = s["rounds"] + s["accepted_tokens"] + s["fallback_steps"] + 1
        assert ev[-1].usage.completion_tokens <= full < ev[-1].usage.completion_tokens + 4


def _with_and_without_overlap(tiny, reqs, k: int) -> tuple[dict, dict]:
    """`reqs` on one engine per `no_overlap` value (False, True): the tokens of each request and
    the chained rows launched, keyed by that value."""
    outs, chained = {}, {}
    for no_overlap in (False, True):
        lanes = len(reqs)
        with tiny.engine(
            spec="mtp", draft_tokens=k, max_concurrency=lanes, no_overlap=no_overlap
        ) as engine:
            count = ChainCount(engine)
            outs[no_overlap] = {rid: tokens(ev) for rid, ev in run_requests(engine, reqs).items()}
        chained[no_overlap] = count.rows
    return outs, chained


def test_no_overlap_never_chains_and_gives_the_same_tokens(dense) -> None:
    outs, chained = _with_and_without_overlap(dense, _requests(2), k=2)
    assert chained[False] > 0 and chained[True] == 0
    assert outs[False] == outs[True]


def test_a_stop_inside_a_round_with_a_chained_successor_keeps_its_conversation(dense) -> None:
    """The round that stops was launched with its successor chained behind it: the successor
    folded it on the device only up to the stop id, so the conversation kept there is exact and
    a follow-up turn reuses it whole and decodes what a plain engine decodes."""
    p = prompt(60, 12)
    with dense.engine(max_concurrency=1) as plain:
        ref = tokens(run_requests(plain, {"a": (p, {"max_tokens": 40, **GREEDY})})["a"])
    # a stop id on an accepted draft well after the first round, with drafts after it accepted
    at = next(i for i in range(12, 30) if ref[i] not in ref[:i])
    first = ref[: at + 1]
    follow = p + first + prompt(61, 5)
    with dense.engine(no_prefix_reuse=True, max_concurrency=1) as plain:
        want = tokens(run_requests(plain, {"b": (follow, {"max_tokens": 10, "greedy": True})})["b"])
    stop = {"max_tokens": 40, "stop_token_ids": frozenset({ref[at]}), **GREEDY}
    with dense.engine(spec="mtp", draft_tokens=4, max_concurrency=1) as engine:
        OracleDrafts(engine, {"a": p + ref}, wrong=lambda pos, j: False)  # every round accepts 4
        count = ChainCount(engine)
        got_a = run_requests(engine, {"a": (p, stop)})["a"]
        chained = count.rows
        assert tokens(got_a) == first
        got_b = run_requests(engine, {"b": (follow, {"max_tokens": 10, "greedy": True})})["b"]
    assert chained >= 2
    assert got_b[-1].num_cached == len(p) + len(first)
    assert tokens(got_b) == want


def test_sampled_and_penalized_rounds_chain_and_reproduce(dense) -> None:
    """Seeded sampling with presence and frequency penalties: the chained rounds take the RNG's
    output index and the penalty counts from the device, and give what unchained rounds give."""
    kw = {"max_tokens": 30, "ignore_eos": True, "temperature": 0.9, "top_p": 0.95}
    kw |= {"presence_penalty": 0.7, "frequency_penalty": 0.4}
    reqs = {f"s{i}": (prompt(80 + i, 10 + 2 * i), {**kw, "seed": 11 + i}) for i in range(3)}
    outs, chained = _with_and_without_overlap(dense, reqs, k=3)
    assert chained[False] > 0 and chained[True] == 0
    assert outs[False] == outs[True]
    assert all(len(t) == 30 for t in outs[False].values())


def test_requests_that_must_not_chain_never_do(dense) -> None:
    base = {"max_tokens": 16, "ignore_eos": True, "greedy": True}
    cases = {
        "stop_string": {**base, "stop": ["never-in-the-output"]},
        "many_stop_ids": {**base, "stop_token_ids": frozenset(range(900, 905))},
    }
    for name, kw in cases.items():
        with dense.engine(spec="mtp", draft_tokens=2, max_concurrency=1) as engine:
            count = ChainCount(engine)
            got = run_requests(engine, {name: (prompt(70, 10), kw)})[name]
        assert len(tokens(got)) == 16, name
        assert count.rows == 0, name


def test_a_cancel_behind_a_chained_round_leaks_nothing(dense) -> None:
    reqs = _requests(3, max_tokens=60)
    with dense.engine(spec="mtp", draft_tokens=3, max_concurrency=3) as engine:
        count = ChainCount(engine)
        handles = {}
        for rid, (p, kw) in reqs.items():
            handles[rid] = RequestHandle(engine.core, engine.make_request(p, request_id=rid, **kw))
        seen = 0
        for event in handles["c1"]:
            seen += len(event.token_ids or [])
            if seen >= 12:
                engine.core.cancel("c1")
        rest = {rid: list(h) for rid, h in handles.items() if rid != "c1"}
        engine.core.scheduler.check_integrity()
        assert not engine.core.scheduler.running
    assert count.rows > 0
    assert all(len(tokens(ev)) == 60 for ev in rest.values())


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_chained_rounds_under_page_pressure_and_preemption(dense, static) -> None:
    """Two running requests outgrow a pool that holds one, with every acceptance length: rounds
    chain while pages last (a sequence whose next round finds no pages lands and runs an
    unchained round beside the other's chained one), then one request pauses for the other (a
    chained sequence is never a pause victim, so chaining stops first: test_chain_planning.py),
    and both still get their solo tokens."""
    reqs = {f"g{i}": (prompt(90 + i, 9 + 4 * i), {"max_tokens": 60, **GREEDY}) for i in range(2)}
    with dense.engine(max_concurrency=1) as plain:
        want = {rid: tokens(run_requests(plain, {rid: r})[rid]) for rid, r in reqs.items()}
    truth = {rid: r[0] + want[rid] for rid, r in reqs.items()}
    mixed = []
    with dense.engine(
        spec="mtp", draft_tokens=3, max_concurrency=2, kv_capacity=112, static_rounds=static
    ) as engine:
        OracleDrafts(engine, truth)
        count = ChainCount(engine)
        runner = engine.core.runner
        launch = runner.launch

        def spy(plan):
            mixed.append({r.chained for r in plan.decode} == {True, False})
            return launch(plan)

        runner.launch = spy
        got = run_requests(engine, reqs)
        preemptions = engine.core.scheduler.num_preemptions
        engine.core.scheduler.check_integrity()
    assert {rid: tokens(ev) for rid, ev in got.items()} == want
    assert count.rows > 0 and preemptions > 0
    assert any(mixed)  # a step held a chained row beside an unchained round


def test_rounds_chain_under_a_thinking_budget_until_it_could_fire() -> None:
    """The demo artifact (its vocabulary has `</think>`): a budget of 14 thinking tokens with
    k = 3 and drafts always right before the cap. Rounds chain while the round in flight cannot
    reach the cap, then land one by one; the control suffix cuts the round that reaches it, and
    the output equals the plain engine's."""
    from ninfer.artifact.demo import ensure_demo
    from support.spec_engines import bind_artifact

    demo = bind_artifact(ensure_demo())
    try:
        p = demo.tokenizer.encode_template(
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
        )
        kw = {"max_tokens": 40, "thinking_budget": 14, "greedy": True}
        with demo.engine(max_context=256, prefill_chunk=64) as plain:
            want = run_requests(plain, {"t": (p, kw)})["t"]
            free = tokens(run_requests(plain, {"f": (p, {"max_tokens": 16, "greedy": True})})["f"])
        with demo.engine(max_context=256, prefill_chunk=64, spec="mtp", draft_tokens=3) as engine:
            OracleDrafts(engine, {"t": p + free}, wrong=lambda pos, j: False)
            count = ChainCount(engine)
            got = run_requests(engine, {"t": (p, kw)})["t"]
        assert tokens(got) == tokens(want)
        assert got[-1].usage == want[-1].usage
        assert count.rows > 0
    finally:
        demo.artifact.close()


def test_a_stop_string_inside_a_chained_round_without_prefix_reuse(dense) -> None:
    """Without a prefix cache a stop string does not keep rounds from chaining: the round it ends
    inside was already folded past it by its successor, which nothing reads. Text, tokens and
    finish reason equal the plain engine's."""
    p = prompt(62, 12)
    with dense.engine(max_concurrency=1, no_prefix_reuse=True) as plain:
        ref = tokens(run_requests(plain, {"a": (p, {"max_tokens": 40, **GREEDY})})["a"])
        text = plain.tokenizer.decode(ref[17:19])
        assert text.strip()
        kw = {"max_tokens": 40, "stop": [text], **GREEDY}
        want = run_requests(plain, {"s": (p, kw)})["s"]
    with dense.engine(spec="mtp", draft_tokens=4, no_prefix_reuse=True) as engine:
        OracleDrafts(engine, {"s": p + ref}, wrong=lambda pos, j: False)
        count = ChainCount(engine)
        got = run_requests(engine, {"s": (p, kw)})["s"]
    assert tokens(got) == tokens(want)
    assert "".join(e.text for e in got) == "".join(e.text for e in want)
    assert got[-1].finish_reason == want[-1].finish_reason and got[-1].stop_string == text
    assert count.rows > 0


def test_queued_requests_keep_chaining_and_get_their_tokens(dense) -> None:
    """Four requests on two lanes: the two queued ones wait while the running ones chain, and
    are admitted as lanes free; every request gets its solo tokens."""
    reqs = _requests(4, max_tokens=20)
    with dense.engine(max_concurrency=1) as plain:
        want = {rid: tokens(run_requests(plain, {rid: r})[rid]) for rid, r in reqs.items()}
    truth = {rid: r[0] + want[rid] for rid, r in reqs.items()}
    with dense.engine(spec="mtp", draft_tokens=3, max_concurrency=2) as engine:
        OracleDrafts(engine, truth)
        count = ChainCount(engine)
        got = run_requests(engine, reqs)
        engine.core.scheduler.check_integrity()
    assert {rid: tokens(ev) for rid, ev in got.items()} == want
    assert count.rows > 0
