"""Step plans and the overlapped loop with a fake runner (no model): the token budget, several
prefills in one step, the two frontiers, exact stops / cancellation / max_tokens one step late,
and a 300-request soak with a tiny KV pool checked after every step.

The fake runner draws token f(prompt, output index) and, like the GPU decode step, feeds a
FROM_DEVICE row the sample it last made for that sequence; it records what each row was fed, so
a test can check that every committed token is exactly the sequence's own next token.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from ninfer.engine.core import EngineCore
from ninfer.engine.errors import ContextLengthExceeded
from ninfer.engine.handles import RequestHandle
from ninfer.engine.kv_pool import PagePool
from ninfer.engine.output import OutputState
from ninfer.engine.plan import FROM_DEVICE, Completed, StepOutcome, StepPlan, outcome_of
from ninfer.engine.request import EngineEvent, EventKind, FinishReason, GenerationRequest
from ninfer.engine.sampling import SamplingParams
from ninfer.engine.scheduler import Scheduler, SchedulerConfig, Sequence
from ninfer.engine.state_slots import SlotPool
from ninfer.tokenizer import Tokenizer

EOS = 248046


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.qwen3_5()


def token_of(seq: Sequence, index: int) -> int:
    eos_at = seq.request.sampling.get("eos_at")
    if eos_at is not None and index == eos_at:
        return EOS
    return 1000 + (sum(seq.token_ids[: seq.num_prompt]) * 31 + index) % 5000


class DeviceLikeRunner:
    """Samples token_of(seq, sample_index); checks each row's feed against the truth."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.plans: list[StepPlan] = []
        self._last: dict[int, int] = {}
        self.bad_feeds: list[str] = []

    def launch(self, plan: StepPlan) -> Completed:
        if self.delay:
            time.sleep(self.delay)
        self.plans.append(plan)
        tokens = []
        for row in plan.rows:
            seq = row.seq
            for i, fed in enumerate(row.token_ids):
                pos = row.start + i
                if fed == FROM_DEVICE:
                    fed = self._last[id(seq)]
                if pos < seq.num_prompt:
                    want = seq.token_ids[pos]
                elif pos < len(seq.token_ids):
                    want = seq.token_ids[pos]  # committed (or control) token
                else:  # the sample of the step still in flight for this sequence
                    want = token_of(seq, pos - seq.num_prompt)
                if fed != want:
                    self.bad_feeds.append(f"{seq.request_id}@{pos}: fed {fed}, want {want}")
            if row.samples:
                tokens.append(token_of(seq, row.sample_index))
                self._last[id(seq)] = tokens[-1]
        return Completed(plan, outcome_of(plan, tokens))


def make(
    tokenizer,
    runner,
    *,
    lanes=4,
    pending=64,
    pages=64,
    page_size=4,
    chunk=8,
    max_context=64,
    budget=None,
    overlap=True,
    check_every_step=True,
):
    sched = Scheduler(
        SchedulerConfig(
            max_concurrency=lanes,
            max_pending=pending,
            prefill_chunk=chunk,
            max_context=max_context,
            max_batched_tokens=budget,
        ),
        PagePool(pages, page_size),
        SlotPool(lanes + 1),
    )
    if check_every_step:  # integrity after every landed step, on the worker thread
        update = sched.update

        def checked(plan: StepPlan, outcome: StepOutcome):
            events = update(plan, outcome)
            sched.check_integrity()
            return events

        sched.update = checked  # type: ignore[method-assign]
    core = EngineCore(
        sched,
        runner,
        tokenizer,
        eos_token_ids=frozenset({EOS}),
        resolve_sampling=lambda r: SamplingParams(greedy=True),
        overlap=overlap,
    )
    return core, sched


def req(n: int, max_tokens: int, base: int = 10, **kw) -> GenerationRequest:
    sampling = {"eos_at": kw.pop("eos_at")} if "eos_at" in kw else {}
    return GenerationRequest(tuple(range(base, base + n)), max_tokens, sampling=sampling, **kw)


def tokens(events: list[EngineEvent]) -> list[int]:
    return [t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids]


def wait_idle(core, sched) -> None:
    for _ in range(1000):
        if core._num_live == 0 and not sched.has_work:
            return
        time.sleep(0.01)
    raise AssertionError("engine did not go idle")


# -- the scheduler alone -------------------------------------------------------------------------


def _seq(tokenizer: Tokenizer, name: str, n: int, max_tokens: int = 8) -> Sequence:
    r = req(n, max_tokens)
    out = OutputState(
        tokenizer, stop_token_ids=frozenset(), stop_strings=(), max_tokens=max_tokens,
        max_context=512,
    )  # fmt: skip
    return Sequence(name, r, SamplingParams(), list(r.prompt_ids), n, 0.0, 1e9, output=out)


def test_budget_fills_decode_rows_first_then_several_prefills(tokenizer) -> None:
    sched = Scheduler(
        SchedulerConfig(max_concurrency=4, prefill_chunk=8, max_context=64, max_batched_tokens=20),
        PagePool(64, 4),
        SlotPool(4),
    )
    a, b, c = _seq(tokenizer, "a", 5), _seq(tokenizer, "b", 6), _seq(tokenizer, "c", 30)
    for s in (a, b, c):
        sched.enqueue(s)
    plan, events = sched.schedule()
    assert [e.kind for _, e in events] == [EventKind.ADMITTED] * 3
    # three prefills in one step: a (5, samples), b (6, samples), c (first 8 of 30): 19 <= 20
    assert [(r.seq.request_id, r.start, r.num_new_tokens, r.samples) for r in plan.prefill] == [
        ("a", 0, 5, True),
        ("b", 0, 6, True),
        ("c", 0, 8, False),
    ]
    assert not plan.decode and plan.num_tokens == 19
    assert all(r.fresh for r in plan.prefill)
    # the next plan (step 1 still in flight): a and b decode from the device, c continues
    plan2, _ = sched.schedule()
    assert [(r.seq.request_id, r.token_ids) for r in plan2.decode] == [
        ("a", (FROM_DEVICE,)),
        ("b", (FROM_DEVICE,)),
    ]
    assert [(r.seq.request_id, r.start, r.num_new_tokens) for r in plan2.prefill] == [
        ("c", 8, 8),
    ]
    # nothing has landed: only update() advances computed tokens
    assert a.num_computed == 0 and a.num_scheduled == 6 and c.num_computed == 0
    sched.update(plan, outcome_of(plan, [101, 102]))
    assert a.num_computed == 5 and a.token_ids[-1] == 101 and c.num_computed == 8
    assert b.output_ids == [102]
    sched.update(plan2, outcome_of(plan2, [201, 202]))
    assert a.output_ids == [101, 201] and a.num_computed == 6 and c.num_computed == 16


def test_a_long_prompt_never_takes_a_decode_row_out_of_a_step(tokenizer) -> None:
    budget = 8 + 3
    sched = Scheduler(
        SchedulerConfig(
            max_concurrency=3, prefill_chunk=8, max_context=512, max_batched_tokens=budget
        ),
        PagePool(512, 4),
        SlotPool(3),
    )
    streams = [_seq(tokenizer, f"s{i}", 4, max_tokens=400) for i in range(2)]
    for s in streams:
        sched.enqueue(s)
    plan, _ = sched.schedule()
    sched.update(plan, outcome_of(plan, [7, 7]))
    sched.enqueue(_seq(tokenizer, "long", 300, max_tokens=1))
    for _ in range(40):  # every step: both streams decode, prefill takes the rest of the budget
        plan, _ = sched.schedule()
        assert [r.seq.request_id for r in plan.decode] == ["s0", "s1"]
        assert plan.num_tokens <= budget
        assert sum(r.num_new_tokens for r in plan.prefill) <= budget - 2
        sched.update(plan, outcome_of(plan, [7] * sum(r.samples for r in plan.rows)))
    sched.check_integrity()


def test_budget_must_hold_every_lane_plus_prefill() -> None:
    with pytest.raises(ValueError, match="max_batched_tokens"):
        Scheduler(
            SchedulerConfig(max_concurrency=8, max_batched_tokens=8), PagePool(8, 4), SlotPool(8)
        )
    with pytest.raises(ValueError, match=r"1\.\.64"):
        Scheduler(SchedulerConfig(max_concurrency=65), PagePool(8, 4), SlotPool(65))


# -- the engine loop -----------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "serial"])
def test_every_request_gets_its_own_tokens_and_nothing_past_its_end(tokenizer, overlap) -> None:
    runner = DeviceLikeRunner()
    core, sched = make(tokenizer, runner, lanes=8, pages=256, overlap=overlap, budget=30)
    try:
        specs = [(3 + i % 7, 5 + i % 11, (i % 4) if i % 3 == 0 else None) for i in range(32)]
        handles = []
        for i, (n, max_tokens, eos_at) in enumerate(specs):
            kw = {} if eos_at is None else {"eos_at": eos_at}
            handles.append(RequestHandle(core, req(n, max_tokens, base=10 + 50 * i, **kw)))
        results = [list(h) for h in handles]
    finally:
        core.close()
    assert not runner.bad_feeds, runner.bad_feeds[:5]
    for (_, max_tokens, eos_at), events in zip(specs, results, strict=True):
        assert sum(e.is_terminal for e in events) == 1 and events[-1].is_terminal
        last = events[-1]
        got = tokens(events)
        want_len = max_tokens if eos_at is None else min(max_tokens, eos_at + 1)
        assert len(got) == want_len == last.usage.completion_tokens
        assert last.finish_reason == (
            FinishReason.STOP if eos_at is not None and eos_at < max_tokens else FinishReason.LENGTH
        )
    # several prefills shared a step, and decode rows were mixed with prefill chunks
    assert max(len(p.prefill) for p in runner.plans) >= 2
    assert any(p.decode and p.prefill for p in runner.plans)


def test_cancel_and_stop_strings_under_the_overlapped_loop(tokenizer) -> None:
    runner = DeviceLikeRunner(delay=0.001)
    core, sched = make(tokenizer, runner, lanes=4, pages=256, max_context=256)
    try:
        seen: list[EngineEvent] = []
        done = threading.Event()

        def sink(e: EngineEvent) -> None:
            seen.append(e)
            if e.kind == EventKind.TOKENS and e.num_output == 5:
                core.cancel("c")
            if e.is_terminal:
                done.set()

        core.submit(req(6, 100, request_id="c"), sink)
        other = list(RequestHandle(core, req(6, 30, base=500)))
        assert done.wait(10)
        wait_idle(core, sched)
    finally:
        core.close()
    assert seen[-1].finish_reason == FinishReason.CANCELLED
    after_cancel = [e for e in seen if e.kind == EventKind.TOKENS and e.num_output > 5]
    # the cancel lands at the next plan: at most the token of the step already in flight follows
    assert len(after_cancel) <= 1
    assert seen[-1].usage.completion_tokens == len(tokens(seen))
    assert other[-1].finish_reason == FinishReason.LENGTH and len(tokens(other)) == 30
    sched.check_integrity()


def test_stop_string_ends_exactly_with_overlap(tokenizer) -> None:
    """The stop string is found when its token lands; the row already launched for the next
    token is discarded: never emitted, never counted."""
    runner = DeviceLikeRunner()
    core, sched = make(tokenizer, runner, lanes=2, pages=256, max_context=256)
    probe = req(6, 40)
    try:
        full = tokens(list(RequestHandle(core, probe)))
        text = tokenizer.decode(full)
        stop = tokenizer.decode(full[10:12])
        assert stop and stop in text
        events = list(RequestHandle(core, req(6, 40, stop=(stop,))))
    finally:
        core.close()
    got = tokens(events)
    assert events[-1].finish_reason == FinishReason.STOP
    cut = text.index(stop)
    assert "".join(e.text for e in events) == text[:cut]
    assert got == full[: len(got)] and len(got) == events[-1].usage.completion_tokens
    assert len(got) <= 12


def test_random_soak_with_cancellations_and_a_tiny_pool(tokenizer) -> None:
    """300 requests, random lengths and limits, 30 % cancelled at random moments, a pool far
    smaller than the demand; integrity is checked after every landed step."""
    rng = random.Random(4321)
    runner = DeviceLikeRunner()
    core, sched = make(
        tokenizer, runner, lanes=6, pending=400, pages=24, chunk=8, max_context=64, budget=20
    )
    events: dict[str, list[EngineEvent]] = {}
    ids: list[str] = []
    try:
        for i in range(300):
            n = rng.randint(1, 60)
            r = GenerationRequest(
                tuple(rng.randrange(100, 9000) for _ in range(n)),
                rng.randint(0, 30),
                request_id=f"r{i}",
                sampling={"eos_at": rng.choice([None, 1, 6])},
            )
            events[r.request_id] = []
            try:
                core.submit(r, events[r.request_id].append)
                ids.append(r.request_id)
            except ContextLengthExceeded:
                del events[r.request_id]
            if rng.random() < 0.3 and ids:
                core.cancel(rng.choice(ids))
        wait_idle(core, sched)
    finally:
        core.close()
    assert len(ids) > 250 and not runner.bad_feeds
    for rid in ids:
        ev = events[rid]
        assert sum(e.is_terminal for e in ev) == 1 and ev[-1].is_terminal, rid
        assert ev[-1].kind == EventKind.FINISHED, ev[-1].error
        assert ev[-1].usage.completion_tokens == len(tokens(ev)), rid
    reasons = {events[r][-1].finish_reason for r in ids}
    assert {FinishReason.CANCELLED, FinishReason.LENGTH, FinishReason.STOP} <= reasons
    sched.check_integrity()
    assert sched.pages.num_free == 24 and sched.slots.num_free == 7
