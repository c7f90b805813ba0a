"""Pause, snapshot and replay in the scheduler, over the simulated device of support/sim_runner.py
(a slot holds the exact token history fed into it, a page the tokens at its positions; every row
checks both): when a unit cannot get its pages the youngest resident pauses, the oldest keeps
going, and a paused request comes back by its host snapshot or by replay without resampling or
re-emitting; every output equals its cold run, integrity holds after every step."""

from __future__ import annotations

import random
import time

import pytest

from ninfer.engine.request import EngineEvent, EventKind, FinishReason, GenerationRequest
from ninfer.tokenizer import Tokenizer
from support.sim_runner import IMAGE_BYTES, SimEngine, out, prompt, req

PAGE_BYTES = 10


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.qwen3_5()


def _engine(tokenizer, *, host_bytes: int, **kw) -> SimEngine:
    e = SimEngine(tokenizer, **kw)
    e.images.page_bytes = PAGE_BYTES
    e.images.host.budget = host_bytes
    return e


def _run_all(e: SimEngine, requests: list[GenerationRequest]) -> dict[str, list[EngineEvent]]:
    events: dict[str, list[EngineEvent]] = {}
    for r in requests:
        events[r.request_id] = []
        e.core.submit(r, events[r.request_id].append)
    e.wait_idle()
    return events


def _cold(tokenizer, requests: list[GenerationRequest]) -> dict[str, list[int]]:
    cold = SimEngine(tokenizer, lanes=1, pages=64, cache=False, max_context=128)
    try:
        return {r.request_id: out(cold.run(r)) for r in requests}
    finally:
        cold.close()


@pytest.mark.parametrize("route", ["snapshot", "replay"])
def test_concurrent_requests_over_a_tiny_pool_pause_and_finish_exactly(tokenizer, route) -> None:
    # four requests that each end at 14 + 30 tokens (11 pages), over 16 pages: they cannot all
    # be resident at once, so the youngest pause again and again
    host = 10_000 if route == "snapshot" else 0
    e = _engine(tokenizer, host_bytes=host, lanes=4, pages=16, chunk=8, budget=12)
    requests = [
        req(prompt(14, 100 * i), max_tokens=30, request_id=f"r{i}", checkpoints=(7,))
        for i in range(4)
    ]
    try:
        events = _run_all(e, requests)
    finally:
        e.close()
    want = _cold(tokenizer, requests)
    done = {rid: ev[-1] for rid, ev in events.items()}
    for rid, ev in events.items():
        assert done[rid].finish_reason == FinishReason.LENGTH, rid  # never cut short
        assert out(ev) == want[rid], rid
        indices = [x.num_output for x in ev if x.kind == EventKind.TOKENS]
        assert indices == list(range(1, 31)), rid  # nothing re-emitted after a resume
        progress = [x.num_processed for x in ev if x.kind == EventKind.PROGRESS]
        assert progress == sorted(set(progress)), rid  # prompt progress never repeats
    assert done["r0"].num_preemptions == 0  # the oldest keeps going
    assert e.sched.num_preemptions >= 3
    assert sum(d.num_preemptions for d in done.values()) == e.sched.num_preemptions
    if route == "snapshot":
        assert e.sched.num_snapshot_restores > 0 and e.sched.num_replay_restores == 0
    else:
        assert e.sched.num_replay_restores > 0 and e.sched.num_snapshot_restores == 0
        assert e.sched.num_replayed_tokens > 0
        # committed output is replayed in chunks (prefill rows over output tokens), not token
        # by token, and those rows never sample
        replay_rows = [r for p in e.runner.plans for r in p.prefill if r.start >= r.seq.num_prompt]
        assert any(r.num_new_tokens > 1 for r in replay_rows)
        assert not any(r.samples for r in replay_rows)
        replayed = sum(d.num_replayed_tokens for d in done.values())
        assert replayed == e.sched.num_replayed_tokens
    assert e.images.host.used == sum(
        e.images.image_bytes for ck in e.cache.checkpoints if not ck.image.on_device
    )  # no snapshot left behind


def test_a_replay_starts_from_the_requests_own_checkpoint(tokenizer) -> None:
    # 14 pages: r0 (20 + 20 tokens: 10 pages) and r1's checkpoint (4 pages) fit; r1 does not
    e = _engine(tokenizer, host_bytes=0, lanes=2, pages=14, chunk=8, extra_slots=2)
    requests = [
        req(prompt(20, 100 * i), max_tokens=20, request_id=f"r{i}", checkpoints=(16,))
        for i in range(2)
    ]
    try:
        events = _run_all(e, requests)
    finally:
        e.close()
    done = events["r1"][-1]
    assert done.num_replay_restores > 0
    # every replay restored r1's own checkpoint at 16 and recomputed only from there
    firsts = [
        r.start for p in e.runner.plans for r in p.rows if r.seq.request_id == "r1" and r.first
    ]
    assert firsts[0] == 0 and firsts[1:] and set(firsts[1:]) == {16}


def test_cancel_and_stop_while_paused_free_the_snapshot(tokenizer) -> None:
    e = _engine(tokenizer, host_bytes=10_000, lanes=3, pages=12, chunk=8)
    cancel_me = "r2"
    events: dict[str, list[EngineEvent]] = {}

    def sink(rid: str):
        def on(ev: EngineEvent) -> None:
            events[rid].append(ev)
            if rid == cancel_me and ev.kind == EventKind.TOKENS and ev.num_output == 12:
                e.core.cancel(rid)

        return on

    try:
        for i in range(3):
            rid = f"r{i}"
            events[rid] = []
            eos = {"eos_at": 25} if i == 1 else {}
            e.core.submit(req(prompt(10, 100 * i), max_tokens=30, request_id=rid, **eos), sink(rid))
        e.wait_idle()
    finally:
        e.close()
    assert events["r2"][-1].finish_reason == FinishReason.CANCELLED
    assert events["r1"][-1].finish_reason == FinishReason.STOP
    assert e.sched.num_preemptions > 0
    assert not e.sched.paused and e.images.host.used == sum(
        e.images.image_bytes for ck in e.cache.checkpoints if not ck.image.on_device
    )


def test_cancelled_while_paused_revokes_the_snapshot_before_its_terminal(tokenizer) -> None:
    e = _engine(tokenizer, host_bytes=10_000, lanes=3, pages=12, chunk=8)
    events: dict[str, list[EngineEvent]] = {}
    cancelled: list[str] = []

    def sink(rid: str):
        def on(ev: EngineEvent) -> None:
            events[rid].append(ev)
            boundary = ev.scheduling
            paused = boundary is not None and boundary.transition == "paused"
            if paused and boundary.route == "snapshot" and not cancelled:
                cancelled.append(rid)  # the first request paused to a snapshot goes away
                e.core.cancel(rid)

        return on

    try:
        for i in range(3):
            rid = f"r{i}"
            events[rid] = []
            request = req(prompt(10, 100 * i), max_tokens=30, request_id=rid,
                          scheduling_events=True)  # fmt: skip
            e.core.submit(request, sink(rid))
        e.wait_idle()
    finally:
        e.close()
    (rid,) = cancelled
    ev = events[rid]
    names = [x.scheduling.transition for x in ev if x.kind == EventKind.SCHEDULING]
    # reaped before any restore: the snapshot is revoked, then the cycle's terminal boundary
    assert names[-4:] == ["pause_started", "paused", "snapshot_revoked", "terminal"], names
    assert ev[-1].finish_reason == FinishReason.CANCELLED
    others = [r for r in events if r != rid]
    assert all(events[r][-1].finish_reason == FinishReason.LENGTH for r in others)
    assert not e.sched.paused and e.images.host.used == sum(
        e.images.image_bytes for ck in e.cache.checkpoints if not ck.image.on_device
    )


def test_soak_with_pauses_both_routes_shared_prefixes_and_cancellations(tokenizer) -> None:
    """300 requests, shared stems, 20 % cancelled, a pool far smaller than the demand and a host
    budget that fits some snapshots and not others: integrity after every step, no leak, every
    output equal to its cold run."""
    rng = random.Random(99)
    stems = [[rng.randrange(100, 9000) for _ in range(30)] for _ in range(3)]
    e = _engine(
        tokenizer, host_bytes=2 * IMAGE_BYTES + 60, lanes=4, pages=20, extra_slots=2,
        host_images=0, chunk=8, max_context=80, budget=14,
    )  # fmt: skip
    requests = []
    for i in range(300):
        stem = stems[rng.randrange(3)]
        body = stem[: rng.randint(1, 30)] + [
            rng.randrange(100, 9000) for _ in range(rng.randint(1, 8))
        ]
        requests.append(
            req(body, max_tokens=rng.randint(1, 30), request_id=f"r{i}",
                checkpoints=sorted(rng.sample(range(1, len(body) + 1), k=rng.randint(0, 2))),
                eos_at=rng.choice([None, None, 4, 17]))
        )  # fmt: skip
    events: dict[str, list[EngineEvent]] = {}
    submitted: list[str] = []
    try:
        for r in requests:
            events[r.request_id] = []
            e.core.submit(r, events[r.request_id].append)
            submitted.append(r.request_id)
            if rng.random() < 0.2:
                e.core.cancel(rng.choice(submitted))
            if rng.random() < 0.3:
                time.sleep(0.002)
        e.wait_idle()
    finally:
        e.core.close()
    assert not e.runner.errors, e.runner.errors[:5]
    e.sched.check_integrity()
    assert e.sched.num_preemptions > 20
    assert e.sched.num_snapshot_restores > 0 and e.sched.num_replay_restores > 0
    want = _cold(tokenizer, requests)
    for r in requests:
        ev = events[r.request_id]
        assert sum(x.is_terminal for x in ev) == 1 and ev[-1].kind == EventKind.FINISHED
        if ev[-1].finish_reason != FinishReason.CANCELLED:
            assert out(ev) == want[r.request_id], r.request_id
    free_host: list[int] = []
    e.cache.clear(free_host)
    assert e.pages.num_free == 20 and e.sched.slots.num_free == 4
    assert e.images.num_free == 2 and e.images.host.used == 0 and not e.sched.paused
