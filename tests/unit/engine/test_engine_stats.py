"""EngineCore's published counters and per-request facts, over the real scheduler and worker.

A fake runner samples deterministic tokens without a model, so the expected counts follow from
the requests alone: every committed output is a generation token, all but each request's first
are decode tokens, and every decode row is one row-round.
"""

from __future__ import annotations

import threading
import time

import pytest

from ninfer.engine.core import EngineCore
from ninfer.engine.handles import RequestHandle
from ninfer.engine.kv_pool import PagePool
from ninfer.engine.plan import Completed, StepPlan, outcome_of
from ninfer.engine.request import EngineEvent, EventKind, FinishReason, GenerationRequest
from ninfer.engine.sampling import SamplingParams
from ninfer.engine.scheduler import Scheduler, SchedulerConfig
from ninfer.engine.state_slots import SlotPool
from ninfer.engine.stats import HOST_PHASES, EngineStats, StatsRecorder
from ninfer.tokenizer import Tokenizer

EOS = 248046


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.qwen3_5()


class Runner:
    """Samples 1000 + output index (never EOS); `gate` holds every step until set."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.gate = gate

    def launch(self, plan: StepPlan) -> Completed:
        if self.gate is not None:
            self.gate.wait()
        tokens = [1000 + r.sample_index for r in plan.rows if r.samples]
        return Completed(plan, outcome_of(plan, tokens))


def make_core(tokenizer: Tokenizer, runner: Runner, *, lanes: int = 2) -> EngineCore:
    sched = Scheduler(
        SchedulerConfig(max_concurrency=lanes, max_pending=8, prefill_chunk=8, max_context=64),
        PagePool(64, 4),
        SlotPool(lanes + 1),
    )
    return EngineCore(
        sched,
        runner,
        tokenizer,
        eos_token_ids=frozenset({EOS}),
        resolve_sampling=lambda req: SamplingParams(greedy=True, seed=7),
    )


def request(num_prompt: int, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(tuple(range(10, 10 + num_prompt)), max_tokens)


def test_counters_after_a_known_mix(tokenizer: Tokenizer) -> None:
    # the worker's host time counts from its start (its first idle loop too) until the snapshot
    # is read: the wall clock that must bound it spans the same
    t0 = time.perf_counter()
    core = make_core(tokenizer, Runner())
    try:
        before = core.stats()
        assert before.kv_capacity_pages == 64 and before.state_capacity_slots == 3
        assert before.generation_tokens == 0 and before.prompt_tokens == 0
        mix = [(5, 7), (21, 3), (9, 0), (3, 1)]  # (prompt, max_tokens); 21 takes three chunks
        handles = [RequestHandle(core, request(p, m)) for p, m in mix]
        results = [list(h) for h in handles]
        assert [r[-1].usage.completion_tokens for r in results] == [m for _, m in mix]
        stats = core.stats()
        wall = time.perf_counter() - t0
        outputs = sum(m for _, m in mix)
        assert stats.prompt_tokens == sum(p for p, _ in mix) == stats.prefill_tokens
        assert stats.cached_prompt_tokens == 0
        assert stats.generation_tokens == outputs
        # each request with output got its first token from prefill
        assert stats.decode_tokens == outputs - sum(1 for _, m in mix if m > 0)
        assert stats.decode_row_rounds == stats.decode_tokens  # no control tokens here
        assert 1 <= stats.decode_rounds <= stats.decode_row_rounds
        assert (stats.running, stats.waiting, stats.prefilling, stats.decode_ready) == (0, 0, 0, 0)
        assert stats.kv_used_pages == 0 and stats.state_used_slots == 0
        zero = ("preemptions", "snapshot_restores", "replay_restores", "replayed_tokens",
                "spec_rounds", "spec_draft_tokens", "spec_accepted_tokens", "paused")  # fmt: skip
        assert all(getattr(stats, name) == 0 for name in zero)
        assert set(stats.host_work_seconds) == set(HOST_PHASES)
        assert stats.host_program_submit_s > 0 and stats.host_engine_commit_output_s > 0
        assert 0 < stats.host_work_total_s <= wall
        assert before.generation_tokens == 0  # a published snapshot never changes
    finally:
        core.close()


def test_terminal_event_sees_its_tokens_counted(tokenizer: Tokenizer) -> None:
    core = make_core(tokenizer, Runner())
    seen: list[EngineStats] = []

    def sink(event: EngineEvent) -> None:
        if event.is_terminal:
            seen.append(core.stats())

    try:
        for i, n in enumerate((4, 6, 1)):
            core.submit(request(5, n), sink)
            deadline = time.monotonic() + 10
            while len(seen) <= i and time.monotonic() < deadline:
                time.sleep(0.001)
            assert seen[i].generation_tokens == (4, 10, 11)[i]
            assert seen[i].running == 0
    finally:
        core.close()


def test_gauges_while_requests_wait_and_run(tokenizer: Tokenizer) -> None:
    gate = threading.Event()
    core = make_core(tokenizer, Runner(gate), lanes=1)
    try:
        handles = [RequestHandle(core, request(20, 2)) for _ in range(3)]
        deadline = time.monotonic() + 10
        while core.stats().waiting != 2 and time.monotonic() < deadline:
            time.sleep(0.001)  # the worker publishes before it blocks in the gated step
        stats = core.stats()
        assert (stats.running, stats.waiting, stats.prefilling, stats.decode_ready) == (1, 2, 1, 0)
        # the whole 20-token prompt's pages are reserved with its first chunk
        assert stats.kv_used_pages == 5 and stats.state_used_slots == 1
        assert stats.prompt_tokens == 20  # counted at admission, once
        gate.set()
        for h in handles:
            list(h)
        assert core.stats().prompt_tokens == 60
    finally:
        gate.set()
        core.close()


def test_request_stats_travel_on_events(tokenizer: Tokenizer) -> None:
    core = make_core(tokenizer, Runner())
    try:
        events = list(RequestHandle(core, request(6, 4)))
        admitted = events[0]
        assert admitted.kind == EventKind.ADMITTED and admitted.stats is not None
        assert admitted.stats.queue_wait_s is not None and admitted.stats.queue_wait_s >= 0
        final = events[-1]
        assert final.finish_reason == FinishReason.LENGTH and final.stats is not None
        committed = [t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids]
        assert list(final.stats.output_ids) == committed == [1000, 1001, 1002, 1003]
        s = final.stats
        assert s.t_submitted <= s.t_admitted <= s.t_first_token <= s.t_last_token <= s.t_finished
        assert s.num_prefill_tokens == 6 and s.num_cached_tokens == 0
        assert s.sampling["seed"] == 7 and s.sampling["greedy"] is True
    finally:
        core.close()


def test_host_phases_are_exclusive() -> None:
    ticks = iter(range(100))
    recorder = StatsRecorder(clock=lambda: float(next(ticks)))
    recorder.phase("engine_boundary")
    recorder.phase("program_submit")
    recorder.publish()  # maintenance time is carved out of program_submit, not added to it
    recorder.phase(None)
    snap = recorder.snapshot()
    assert snap.host_engine_maintenance_s == 0.0  # accrued after this snapshot was taken
    recorder.publish()
    snap = recorder.snapshot()
    assert snap.host_engine_maintenance_s > 0
    assert snap.published_at == 1.0  # the injected clock, one tick per publish


def test_every_commit_carries_the_cumulative_timings(tokenizer: Tokenizer) -> None:
    # The per-token timings a stream shows are these snapshots: the engine's admission and commit
    # instants, so they agree with the terminal timings (prompt time is fixed by the first token,
    # the decode interval grows with each commit and ends where the terminal one ends).
    core = make_core(tokenizer, Runner())
    try:
        events = list(RequestHandle(core, request(21, 6)))
    finally:
        core.close()
    commits = [e for e in events if e.kind == EventKind.TOKENS]
    final = events[-1].timings
    assert final is not None and len(commits) == 6
    snaps = [e.timings for e in commits]
    assert all(s is not None for s in snaps)
    assert [s.predicted_n for s in snaps] == [e.num_output for e in commits] == list(range(1, 7))
    assert {(s.cache_n, s.prompt_n, s.prompt_ms) for s in snaps} == {
        (final.cache_n, final.prompt_n, final.prompt_ms)
    }
    assert final.prompt_ms > 0 and snaps[0].predicted_ms == 0.0
    spans = [s.predicted_ms for s in snaps]
    assert spans == sorted(spans) and spans[-1] == final.predicted_ms
