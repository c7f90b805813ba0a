"""Stage times of request_done from the engine's instants: admitted or not, with or without
output. Instants are exact binary fractions so the expected seconds are exact too."""

from __future__ import annotations

from ninfer.engine.request import RequestStats
from ninfer.server.request_records import StageTimes


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
