"""`/metrics` formatting: every metric of the spec's Live-metrics table, values copied from one
published engine snapshot, cumulative histogram buckets, bounded labels.

The text is parsed back with prometheus-client's own parser (an independent reader of format
0.0.4), so a malformed line or a wrong suffix fails here.
"""

from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from ninfer.engine.options import EngineOptions
from ninfer.engine.stats import EngineStats
from ninfer.server.metrics import (
    CONTENT_TYPE,
    OUTCOMES,
    MetricsCollector,
    ServerMetrics,
    make_registry,
    render,
)

SPEC_METRICS = {  # the spec's table; counters appear with _total, histograms as one family
    "ninfer_model_info", "ninfer_max_concurrency", "ninfer_max_context_tokens",
    "ninfer_engine_ready",
    "ninfer_requests_running", "ninfer_requests_waiting", "ninfer_requests_paused",
    "ninfer_requests_prefilling", "ninfer_requests_decode_ready", "ninfer_requests_replaying",
    "ninfer_requests_materializing",
    "ninfer_prompt_tokens", "ninfer_prompt_tokens_cached", "ninfer_prefill_tokens",
    "ninfer_replayed_tokens", "ninfer_generation_tokens", "ninfer_decode_tokens",
    "ninfer_spec_decode_rounds", "ninfer_spec_decode_draft_tokens",
    "ninfer_spec_decode_accepted_tokens", "ninfer_spec_decode_fallback_steps",
    "ninfer_preemptions", "ninfer_snapshot_restores", "ninfer_replay_restores",
    "ninfer_device_kv_used_pages", "ninfer_device_kv_capacity_pages",
    "ninfer_device_state_used_slots", "ninfer_device_state_capacity_slots",
    "ninfer_host_context_used_bytes", "ninfer_host_context_reserved_bytes",
    "ninfer_host_context_capacity_bytes", "ninfer_host_context_peak_bytes",
    "ninfer_context_transfer_bytes", "ninfer_host_work_seconds", "ninfer_device_wait_seconds",
    "ninfer_requests", "ninfer_response_failures",
    "ninfer_time_to_first_token_seconds", "ninfer_request_duration_seconds",
    "ninfer_request_queue_seconds",
}  # fmt: skip


def engine_with(stats: EngineStats, healthy: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        options=EngineOptions(max_concurrency=4, max_context=4096, dtype="fp32"),
        artifact=SimpleNamespace(metadata={"architecture": "qwen3_5"}),
        core=SimpleNamespace(healthy=healthy),
        stats=lambda: stats,
    )


def scrape(engine: SimpleNamespace, server: ServerMetrics) -> dict:
    text = render(make_registry(MetricsCollector(engine, server, "m"))).decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(family, suffix: str = "", **labels: str) -> float:
    (sample,) = [s for s in family.samples if s.name == family.name + suffix and s.labels == labels]
    return sample.value


def test_every_spec_metric_with_the_snapshot_values() -> None:
    # distinct values per field, so a metric wired to the wrong field is caught
    numbers = {f.name: i + 1 for i, f in enumerate(fields(EngineStats)) if f.name != "published_at"}
    stats = EngineStats(**numbers)
    families = scrape(engine_with(stats), ServerMetrics())
    assert set(families) >= SPEC_METRICS
    assert value(families["ninfer_generation_tokens"], "_total") == stats.generation_tokens
    assert value(families["ninfer_decode_tokens"], "_total") == stats.decode_tokens
    assert value(families["ninfer_prompt_tokens_cached"], "_total") == stats.cached_prompt_tokens
    assert value(families["ninfer_requests_decode_ready"]) == stats.decode_ready
    assert value(families["ninfer_device_kv_used_pages"]) == stats.kv_used_pages
    assert value(families["ninfer_spec_decode_draft_tokens"], "_total") == stats.spec_draft_tokens
    host = families["ninfer_host_work_seconds"]
    assert value(host, "_total", phase="program_submit") == stats.host_program_submit_s
    assert value(families["ninfer_max_concurrency"]) == 4
    assert value(families["ninfer_max_context_tokens"]) == 4096
    assert value(families["ninfer_engine_ready"]) == 1
    info = families["ninfer_model_info"]
    assert value(info, model="m", architecture="qwen3_5", dtype="fp32", device="cpu") == 1


def test_outcomes_and_histograms() -> None:
    server = ServerMetrics()
    server.requests["completed"] = 3
    server.requests["rejected"] = 2
    server.response_failures = 1
    for v in (0.003, 0.2, 0.2, 7.0, 1e6):  # 1e6 lands only in +Inf
        server.duration.observe(v)
    families = scrape(engine_with(EngineStats(), healthy=False), server)
    requests = families["ninfer_requests"]
    got = {outcome: value(requests, "_total", outcome=outcome) for outcome in OUTCOMES}
    assert got == {"completed": 3, "cancelled": 0, "rejected": 2, "failed": 0}
    assert value(families["ninfer_response_failures"], "_total") == 1
    assert value(families["ninfer_engine_ready"]) == 0  # readable after an engine failure
    duration = families["ninfer_request_duration_seconds"]
    assert value(duration, "_count") == 5
    assert value(duration, "_sum") == sum((0.003, 0.2, 0.2, 7.0, 1e6))
    assert value(duration, "_bucket", le="0.05") == 1
    assert value(duration, "_bucket", le="0.25") == 3
    assert value(duration, "_bucket", le="10.0") == 4
    assert value(duration, "_bucket", le="+Inf") == 5
    assert value(families["ninfer_time_to_first_token_seconds"], "_count") == 0


def test_labels_are_bounded_and_the_format_is_0_0_4() -> None:
    families = scrape(engine_with(EngineStats()), ServerMetrics())
    allowed = {"outcome", "phase", "resource", "direction", "le", "model", "architecture",
               "dtype", "device"}  # fmt: skip
    for family in families.values():
        for sample in family.samples:
            assert set(sample.labels) <= allowed, sample
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
