"""Stage times of request_done from the engine's instants: admitted or not, with or without
output. Instants are exact binary fractions so the expected seconds are exact too. The prefix
path and miss reason come from the request's x-ninfer-prefix-cache value, the scheduling object
from the engine's per-request pressure facts."""

from __future__ import annotations

from ninfer.engine.request import RequestStats
from ninfer.server.request_records import StageTimes, prefix_fields, scheduling_json


def test_a_request_with_output() -> None:
    stats = RequestStats(t_submitted=10.25, t_admitted=10.5, t_first_token=11.0,
                         t_last_token=13.0, t_finished=13.25, output_ids=(1, 2, 3))  # fmt: skip
    t = StageTimes.of(stats, t_start=10.0, t_submitted=10.25, end=14.0)
    assert t == StageTimes(prepare=0.25, ttft=1.0, queue_wait=0.25, prefill=0.5, decode=2.0,
                           resident=2.75)  # fmt: skip


def test_cancelled_while_waiting() -> None:
    stats = RequestStats(t_submitted=10.25, t_finished=12.0)
    t = StageTimes.of(stats, t_start=10.0, t_submitted=10.25, end=12.5)
    assert t == StageTimes(0.25, None, 1.75, None, None, None)  # the whole wait was queue


def test_prompt_only_request_has_no_ttft() -> None:
    stats = RequestStats(t_submitted=1.0, t_admitted=1.0, t_first_token=2.0, t_finished=2.0)
    t = StageTimes.of(stats, t_start=0.5, t_submitted=1.0, end=2.5)
    assert t.ttft is None and t.prefill == 1.0 and t.decode == 0.0 and t.resident == 1.0


def test_without_engine_facts_only_preparation_is_known() -> None:
    t = StageTimes.of(None, t_start=1.0, t_submitted=1.5, end=3.0)
    assert t == StageTimes(0.5, None, 0.0, None, None, None)


def test_prefix_path_and_miss_reason() -> None:
    hit = prefix_fields("hit=812; path=checkpoint", 812)
    assert hit == {"prefix_reuse_path": "checkpoint", "prefix_cache_miss_reason": None}
    diverged = prefix_fields("hit=0; miss=diverged@431", 0)
    assert diverged == {"prefix_reuse_path": "root", "prefix_cache_miss_reason": "diverged@431"}
    assert prefix_fields("miss=evicted", 0)["prefix_cache_miss_reason"] == "evicted"
    assert prefix_fields("miss=disabled", 0) == {
        "prefix_reuse_path": None, "prefix_cache_miss_reason": "disabled"}  # fmt: skip


def test_scheduling_object_from_the_engine_facts() -> None:
    stats = RequestStats(t_submitted=0.0, num_preemptions=3, num_snapshot_restores=1,
                         num_replay_restores=2, num_replayed_tokens=40, paused_s=0.5,
                         transfer_bytes={"state": {"to_host": 7, "to_device": 7}})  # fmt: skip
    got = scheduling_json(stats)
    assert got == {
        "preemptions": 3, "snapshot_restores": 1, "replay_restores": 2, "replayed_tokens": 40,
        "paused_seconds": 0.5,
        "transfer_bytes": {"state": {"to_host": 7, "to_device": 7},
                           "main_kv": {"to_host": 0, "to_device": 0}},
    }  # fmt: skip
    assert scheduling_json(None)["preemptions"] == 0
