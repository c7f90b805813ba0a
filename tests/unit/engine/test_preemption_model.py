"""Paused = unpaused on the real engine and model (tiny checkpoint, CPU, fp32). Four concurrent
requests over a KV pool that holds less than two of them at full length: the youngest pause
again and again, by host snapshot (the default host budget) or by replay (`host_context_mib=0`),
and every request still gets exactly its solo tokens, greedy and seeded, to its full length. The
pressure shows in the engine's counters, in `/metrics` (its renderer over this engine) and in each
request's pause-cycle boundaries (the request_scheduling records, validated against the schema)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from ninfer import Engine
from ninfer.engine.handles import RequestHandle
from ninfer.engine.request import EngineEvent, EventKind, FinishReason
from ninfer.server import request_records
from ninfer.server.metrics import MetricsCollector, ServerMetrics, make_registry, render
from ninfer.server.request_log import SCHEMA_PATH, RequestLog
from ninfer.testing import TinySpec
from support.tiny_artifacts import convert_tiny

VOCAB = 8192
BASE = {"dtype": "fp32", "page_size": 16, "max_context": 256, "prefill_chunk": 16}
MAX_TOKENS = 48
SAMPLERS = {
    "greedy": {"greedy": True},
    "seeded": {"temperature": 0.9, "top_p": 0.95, "presence_penalty": 0.3},
}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = TinySpec(kind="dense", vocab_size=VOCAB, with_vision=False)
    _, path = convert_tiny(tmp_path_factory.mktemp("pause"), spec, seed=3, name="tiny")
    return path


def _prompt(i: int) -> list[int]:
    g = torch.Generator().manual_seed(40 + i)
    return torch.randint(0, VOCAB, (18 + 5 * i,), generator=g).tolist()


def _requests(engine: Engine, sampler: str, events: bool = False) -> list:
    sampling = dict(SAMPLERS[sampler])
    return [
        engine.make_request(
            _prompt(i),
            max_tokens=MAX_TOKENS,
            ignore_eos=True,
            request_id=f"r{i}",
            scheduling_events=events,
            **sampling,
            **({"seed": 500 + i} if sampler == "seeded" else {}),
        )
        for i in range(4)
    ]


def _tokens(events: list[EngineEvent]) -> list[int]:
    return [t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids]


@pytest.fixture(scope="module")
def solo(artifact: Path) -> dict[str, dict[str, list[int]]]:
    with Engine.load(artifact, max_concurrency=1, **BASE) as engine:
        return {
            sampler: {r.request_id: _tokens(list(RequestHandle(engine.core, r)))
                      for r in _requests(engine, sampler)}
            for sampler in SAMPLERS
        }  # fmt: skip


@pytest.mark.parametrize("sampler", list(SAMPLERS))
@pytest.mark.parametrize("host_context_mib", [None, 0], ids=["snapshot", "replay"])
def test_paused_equals_unpaused(artifact, solo, sampler, host_context_mib) -> None:
    # 7 pages of 16 tokens; each request ends at 18..33 + 48 tokens (5..6 pages)
    with Engine.load(
        artifact,
        max_concurrency=4,
        kv_capacity=112,
        host_context_mib=host_context_mib,
        **BASE,
    ) as engine:
        handles = [RequestHandle(engine.core, r) for r in _requests(engine, sampler, True)]
        events = {h.request_id: list(h) for h in handles}
        sched = engine.core.scheduler
        counters = (sched.num_preemptions, sched.num_snapshot_restores, sched.num_replay_restores)
        stats = engine.stats()
        metrics = _scrape(engine)
    for rid, ev in events.items():
        assert ev[-1].finish_reason == FinishReason.LENGTH, rid
        assert _tokens(ev) == solo[sampler][rid], rid
    preemptions, snapshots, replays = counters
    assert preemptions >= 4
    done = [ev[-1] for ev in events.values()]
    assert sum(d.num_preemptions for d in done) == preemptions
    if host_context_mib is None:
        assert snapshots > 0 and replays == 0
    else:
        assert replays > 0 and snapshots == 0
    # the engine's published counters and /metrics say the same
    replayed = sum(d.num_replayed_tokens for d in done)
    assert (replays > 0) == (replayed > 0)
    expected = {
        "ninfer_preemptions_total": preemptions,
        "ninfer_snapshot_restores_total": snapshots,
        "ninfer_replay_restores_total": replays,
        "ninfer_replayed_tokens_total": replayed,
        "ninfer_prefill_tokens_total": sum(len(_prompt(i)) for i in range(4)),  # replay apart
        "ninfer_requests_paused": 0,
        "ninfer_requests_replaying": 0,
    }
    assert {k: metrics[k] for k in expected} == expected
    assert (stats.preemptions, stats.snapshot_restores, stats.replay_restores) == counters
    assert stats.replayed_tokens == replayed and stats.paused == 0
    moved = metrics['ninfer_context_transfer_bytes_total{direction="to_host",resource="state"}']
    assert (moved > 0) == (host_context_mib is None)  # snapshots go to the host, replays do not
    for rid, ev in events.items():
        _check_cycles([e for e in ev if e.kind == EventKind.SCHEDULING], ev[-1], rid)


SCHEMA = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
ORDER = ("pause_started", "paused", "restore_started", "restored")


def _scrape(engine: Engine) -> dict[str, float]:
    text = render(make_registry(MetricsCollector(engine, ServerMetrics(), "m"))).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


def _check_cycles(boundaries: list[EngineEvent], done: EngineEvent, rid: str) -> None:
    """Each pause cycle's boundaries in order, with its route, and counters that never go back;
    the records the server would write validate against the published schema."""
    names = [b.scheduling.transition for b in boundaries]
    assert names.count("pause_started") == done.num_preemptions, rid
    if not done.num_preemptions:
        assert not names, rid
        return
    assert names[-1] == "terminal", rid
    log = RequestLog(None)
    last = None
    for b in boundaries:
        body = request_records.scheduling_body("req-1", b.scheduling)
        SCHEMA.validate(log.envelope("request_scheduling", body))
        if last is not None:
            assert b.scheduling.steady_ns >= last.steady_ns, rid
            for scope in ("global", "request"):
                for key, n in b.scheduling.progress[scope].items():
                    assert n >= last.progress[scope][key], (rid, scope, key)
        last = b.scheduling
    cycles: list[list] = []
    for b in boundaries[:-1]:
        if b.scheduling.transition == "pause_started":
            cycles.append([])
        cycles[-1].append(b.scheduling)
    for index, cycle in enumerate(cycles):
        assert [c.preemption_index for c in cycle] == [index] * len(cycle), rid
        steps = [c.transition for c in cycle]
        assert steps[:2] == list(ORDER[:2]) and cycle[0].route is None, (rid, steps)
        route = cycle[1].route
        assert route in ("snapshot", "replay") and all(c.route == route for c in cycle[1:])
        if len(steps) > 2:  # (a later cycle may start before a fresh unit landed)
            assert steps[2:4] == list(ORDER[2:]), (rid, steps)
            assert ("replay_complete" in steps) == (route == "replay"), (rid, steps)
    # the request's own replay counter is its replayed tokens
    assert last.progress["request"]["replay"] == done.num_replayed_tokens, rid


def test_soak_on_the_model_shared_prefixes_cancellations_tiny_pool(artifact) -> None:
    """40 greedy requests over three shared stems, a fifth of them cancelled, 4 lanes over a pool
    of 8 pages and a host budget that takes some snapshots and not others: every finished
    request equals its cold solo run, and the pools are whole at the end."""
    import random

    rng = random.Random(5)
    stems = [_prompt(90 + i) for i in range(3)]
    bodies = [
        stems[rng.randrange(3)][: rng.randint(4, 18)] + _prompt(200 + i)[: rng.randint(1, 6)]
        for i in range(40)
    ]
    limits = [rng.randint(1, 40) for _ in bodies]
    with Engine.load(
        artifact,
        max_concurrency=4,
        max_pending_requests=64,
        kv_capacity=128,
        host_context_mib=1,
        **BASE,
    ) as engine:
        # room for about two snapshots of this tiny model (24 KiB state + 8 KiB a page): the
        # others replay
        engine.core.scheduler.images.host.budget = 100_000
        handles = []
        for i, (body, limit) in enumerate(zip(bodies, limits, strict=True)):
            request = engine.make_request(
                body, max_tokens=limit, ignore_eos=True, greedy=True, request_id=f"s{i}",
                cache_checkpoints=(len(body) // 2,),
            )  # fmt: skip
            handles.append(RequestHandle(engine.core, request))
            if rng.random() < 0.2:
                handles[rng.randrange(len(handles))].cancel()
        results = [list(h) for h in handles]
        sched = engine.core.scheduler
        routes = (sched.num_preemptions, sched.num_snapshot_restores, sched.num_replay_restores)
        engine.core.close()
        sched.check_integrity()
        assert not sched.running and not sched.paused and sched.slots.num_free == 4
    with Engine.load(artifact, max_concurrency=1, **BASE) as solo:
        for body, limit, events in zip(bodies, limits, results, strict=True):
            assert events[-1].kind == EventKind.FINISHED
            if events[-1].finish_reason == FinishReason.CANCELLED:
                continue
            request = solo.make_request(body, max_tokens=limit, ignore_eos=True, greedy=True)
            assert _tokens(events) == _tokens(list(RequestHandle(solo.core, request)))
    preemptions, snapshot_restores, replay_restores = routes
    assert preemptions > 0 and snapshot_restores > 0 and replay_restores > 0, routes
