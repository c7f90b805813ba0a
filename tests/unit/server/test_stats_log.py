"""Throughput records: interval deltas of the engine's counters, idle intervals omitted, plain
text on stderr, and the JSONL record valid against the published schema."""

from __future__ import annotations

import json
import logging

import jsonschema

from ninfer.engine.stats import EngineStats
from ninfer.server.request_log import SCHEMA_PATH, RequestLog
from ninfer.server.stats_log import ThroughputReporter, pretty, throughput_body

VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))


def test_deltas_rates_batch_and_host_fraction() -> None:
    old = EngineStats(prefill_tokens=100, generation_tokens=10, decode_tokens=8, decode_rounds=4,
                      decode_row_rounds=8, host_program_submit_s=1.0)  # fmt: skip
    new = EngineStats(prefill_tokens=1100, generation_tokens=60, decode_tokens=56, decode_rounds=16,
                      decode_row_rounds=56, host_program_submit_s=1.5, host_engine_boundary_s=0.25,
                      running=3, prefilling=1, decode_ready=2, waiting=4)  # fmt: skip
    body = throughput_body(old, new, 2.0, 2000)
    assert body is not None
    assert body["tokens"]["prefill"] == 1000 and body["tokens"]["decode"] == 48
    assert body["rates"]["prefill_tokens_per_second"] == 500.0
    assert body["rates"]["decode_tokens_per_second"] == 24.0
    assert body["decode_batch"] == {"rounds": 12, "row_rounds": 48, "average_size": 4.0}
    assert body["host_work"]["elapsed_seconds"]["total"] == 0.75
    assert body["host_work"]["active_fraction"] == 0.375
    assert body["scheduler"]["waiting"] == 4
    line = pretty(body)
    assert "prefill 1,000 tok 500.0 tok/s" in line and "decode 48 tok 24.0 tok/s" in line
    assert "running 3 (prefilling 1, decode-ready 2)" in line and "waiting 4" in line
    assert "batch 4.00" in line and "host 0.75s 37.5%" in line
    assert "paused" not in line  # zero states are left out
    assert "\x1b" not in line  # no terminal control sequences


def test_idle_intervals_are_omitted_but_a_stuck_queue_is_not() -> None:
    idle = EngineStats(generation_tokens=5)
    assert throughput_body(idle, idle, 5.0, 5000) is None
    stuck = EngineStats(generation_tokens=5, waiting=2)
    body = throughput_body(idle, stuck, 5.0, 5000)
    assert body is not None and body["decode_batch"]["average_size"] is None


def test_the_reporter_logs_and_records_each_busy_interval(tmp_path, caplog) -> None:
    snapshots = iter([EngineStats(), EngineStats(generation_tokens=7, decode_tokens=6,
                                                 decode_rounds=6, decode_row_rounds=6),
                      EngineStats(generation_tokens=7, decode_tokens=6, decode_rounds=6,
                                  decode_row_rounds=6)])  # fmt: skip
    clock = iter([0.0, 1.0, 2.0])
    log = RequestLog.open(tmp_path / "log.jsonl")
    reporter = ThroughputReporter(lambda: next(snapshots), 1000, log, clock=lambda: next(clock))
    with caplog.at_level(logging.INFO, logger="ninfer.server"):
        assert reporter.tick() is not None
        assert reporter.tick() is None  # nothing happened in the second interval
    log.close()
    (record,) = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    VALIDATOR.validate(record)
    assert record["event"] == "throughput" and record["interval_seconds"] == 1.0
    assert record["configured_interval_ms"] == 1000 and record["tokens"]["decode"] == 6
    assert [r.getMessage() for r in caplog.records] == [pretty(record)]
