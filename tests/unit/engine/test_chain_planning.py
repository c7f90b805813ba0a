"""When the scheduler chains a speculative round (`Scheduler.chainable`), on the scheduler alone.

A chained round is planned while the sequence's round is in flight, so it may only be planned
where nothing the host decides at that round's landing could contradict what the device
assumed. Each condition of `chainable` is switched off here in turn, against a sequence that
chains when all hold; and a landing with a chained successor moves the frontiers to the
successor's true start and queues no FOLD (the successor folds on the device).
"""

from __future__ import annotations

import pytest

from ninfer.engine.kv_pool import PagePool
from ninfer.engine.output import OutputState
from ninfer.engine.plan import FOLD, StepOutcome, StepPlan, outcome_of
from ninfer.engine.request import GenerationRequest
from ninfer.engine.sampling import SamplingParams
from ninfer.engine.scheduler import Scheduler, SchedulerConfig, Sequence
from ninfer.engine.state_slots import SlotPool
from ninfer.engine.thinking_budget import ThinkingBudget, ThinkingControl
from ninfer.tokenizer import Tokenizer

K = 2


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.qwen3_5()


def _scheduler(pages: int = 64) -> Scheduler:
    config = SchedulerConfig(max_concurrency=2, prefill_chunk=16, max_context=256, draft_tokens=K)
    return Scheduler(config, PagePool(pages, 4), SlotPool(3))


def _seq(tokenizer, name: str, *, max_tokens: int = 40, stop=(), stop_ids=frozenset()) -> Sequence:
    r = GenerationRequest(tuple(range(10, 18)), max_tokens, stop=stop)
    out = OutputState(tokenizer, stop_token_ids=stop_ids, stop_strings=stop,
                      max_tokens=max_tokens, max_context=256)  # fmt: skip
    return Sequence(name, r, SamplingParams(), list(r.prompt_ids), 8, 0.0, 1e9, output=out)


def _in_flight(sched: Scheduler, seq: Sequence) -> StepPlan:
    """Prefill seq and land it, then plan (not land) its first round."""
    sched.enqueue(seq)
    plan, _ = sched.schedule()
    sched.update(plan, outcome_of(plan, [500]))
    plan, _ = sched.schedule()
    (row,) = plan.decode
    assert row.num_drafts == K and not row.chained
    return plan


def _land_round(sched: Scheduler, plan: StepPlan, committed: tuple[int, ...]) -> None:
    n = len(plan.decode)
    sched.update(
        plan, StepOutcome((committed[0],) * n, (committed,) * n, (len(committed) - 1,) * n)
    )


def test_a_round_in_flight_chains_and_its_landing_fixes_the_successor(tokenizer) -> None:
    sched = _scheduler()
    seq = _seq(tokenizer, "a")
    first = _in_flight(sched, seq)
    assert sched.may_plan_ahead(first)
    chained, _ = sched.schedule()
    (row,) = chained.decode
    assert row.chained and row.start == first.decode[0].start + K + 1  # the bound
    again, _ = sched.schedule()
    assert again.is_empty  # two rounds in flight: nothing more until one lands
    _land_round(sched, first, (601, 602))  # one draft accepted: the successor starts at L + 2
    start = first.decode[0].start + 2
    assert (seq.num_computed, seq.num_scheduled) == (start, start + 1 + K)
    assert seq.token_ids[-2:] == [601, 602]
    nxt, _ = sched.schedule()
    assert not any(op.kind == FOLD for op in nxt.copies)  # the chained row folds on the device
    assert (nxt.decode[0].chained, nxt.decode[0].start) == (True, start + 1 + K)  # chains again
    assert (seq.slot, 601) not in nxt.count_tokens  # counted by the successor on the device
    _land_round(sched, chained, (603,))  # the chained row lands at its true start
    assert seq.num_computed == start + 1 and seq.token_ids[-1] == 603


def test_a_landing_without_successor_queues_the_fold(tokenizer) -> None:
    sched = _scheduler()
    seq = _seq(tokenizer, "a")
    first = _in_flight(sched, seq)
    _land_round(sched, first, (601, 602, 603))
    plan, _ = sched.schedule()
    assert [op.src for op in plan.copies if op.kind == FOLD] == [(K + 1,)]
    assert not plan.decode[0].chained


@pytest.mark.parametrize(
    "block",
    ["paused", "short_of_pages", "budget", "stop_string", "stop_ids", "max_tokens",
     "cancelled", "fallback"],
)  # fmt: skip
def test_what_keeps_a_round_from_chaining(tokenizer, block) -> None:
    sched = _scheduler()
    kw = {}
    if block == "stop_string":
        kw["stop"] = ("zz",)
    elif block == "stop_ids":
        kw["stop_ids"] = frozenset(range(5))  # more than a round checks on the device
    elif block == "max_tokens":
        kw["max_tokens"] = 1 + K + 1  # the round in flight could end the request
    seq = _seq(tokenizer, "a", **kw)
    first = _in_flight(sched, seq)
    if block == "stop_string":
        sched.cache = object()  # a prefix cache (only its presence matters to `chainable`)
    if block == "paused":
        sched.paused.append(_seq(tokenizer, "p"))
    elif block == "short_of_pages":
        sched._short_of_pages = True
    elif block == "budget":
        seq.budget = ThinkingBudget(3, ThinkingControl.from_tokenizer(tokenizer))
    elif block == "cancelled":
        seq.cancelled = True
    elif block == "fallback":
        seq.num_scheduled = seq.num_computed + 1  # what a fallback step in flight leaves
    assert not sched.chainable(seq)
    assert not sched.may_plan_ahead(first)
    # (a schedule resets the page flag, reaps the cancel, resumes the stand-in paused one and
    # would call into the stand-in cache)
    if block not in ("short_of_pages", "cancelled", "paused", "stop_string"):
        plan, _ = sched.schedule()
        assert not any(r.chained for r in plan.decode)


@pytest.mark.parametrize(
    ("cap", "is_open", "chains"),
    [(4, True, False), (5, True, True), (4, False, True)],
    ids=["reachable", "beyond_the_round", "thinking_closed"],
)
def test_a_thinking_budget_blocks_chaining_only_while_the_round_could_reach_it(
    tokenizer, cap, is_open, chains
) -> None:
    """The round in flight commits at most k + 1 tokens after the one output token so far: a cap
    of 1 + k + 1 could fire inside it (its control suffix would cut the round), one more cannot;
    a closed think block never fires."""
    sched = _scheduler()
    seq = _seq(tokenizer, "a")
    first = _in_flight(sched, seq)
    assert seq.num_output == 1
    seq.budget = ThinkingBudget(cap, ThinkingControl.from_tokenizer(tokenizer))
    seq.budget.is_open = is_open
    assert sched.chainable(seq) is chains
    assert sched.may_plan_ahead(first) is chains


def test_stop_strings_chain_without_a_prefix_cache(tokenizer) -> None:
    sched = _scheduler()  # no prefix cache: no conversation is kept, none can be over-folded
    seq = _seq(tokenizer, "a", stop=("zz",))
    first = _in_flight(sched, seq)
    assert sched.chainable(seq) and sched.may_plan_ahead(first)


def test_requests_waiting_for_a_lane_do_not_stop_chaining(tokenizer) -> None:
    """Admission waits for a lane or pages (a finish frees them) and never pauses anyone, so a
    full house with a queue keeps chaining; the queued request is admitted once a lane frees."""
    sched = Scheduler(
        SchedulerConfig(max_concurrency=1, prefill_chunk=16, max_context=256, draft_tokens=K),
        PagePool(64, 4),
        SlotPool(2),
    )
    seq = _seq(tokenizer, "a")
    first = _in_flight(sched, seq)
    late = _seq(tokenizer, "late")
    sched.enqueue(late)
    assert sched.chainable(seq) and sched.may_plan_ahead(first)
    plan, _ = sched.schedule()
    assert [r.chained for r in plan.decode] == [True] and late in sched.waiting


def test_a_cut_under_a_successor_fails_that_request_only(tokenizer) -> None:
    """`chainable` rules out a round cut without a finish while a successor is in flight; forced
    here (a thinking budget set after chaining fires inside the round), the request ends with
    an engine error event, its successor is discarded, and the scheduler stays whole."""
    sched = _scheduler()
    seq, other = _seq(tokenizer, "a"), _seq(tokenizer, "b")
    first = _in_flight(sched, seq)
    chained, _ = sched.schedule()
    assert [r.chained for r in chained.decode if r.seq is seq] == [True]
    seq.budget = ThinkingBudget(2, ThinkingControl.from_tokenizer(tokenizer))  # fires at 2
    n = len(first.decode)
    committed = (601, 602, 603)
    outcome = StepOutcome((601,) * n, (committed,) * n, (len(committed) - 1,) * n)
    events = sched.update(first, outcome)
    errors = [e for s, e in events if s is seq and e.kind.value == "error"]
    assert len(errors) == 1 and errors[0].error.code == "engine_failure"
    assert seq.slot is None and seq not in sched.running
    sched.update(chained, outcome_of(chained, [700] * len(chained.rows)))  # discarded
    sched.check_integrity()
    sched.enqueue(other)  # the scheduler goes on serving
    plan, _ = sched.schedule()
    assert [r.seq for r in plan.prefill] == [other]
