"""`GET /metrics`: Prometheus text 0.0.4 (prometheus-client) from the engine's published snapshot
and the server's request outcomes. The collector copies the snapshot and formats it on the event
loop, so a scrape never waits for or adds work to the engine worker; server counters are updated
by the lifecycle on the loop (no locks). Labels are bounded; no request id or text.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from ninfer.engine.stats import HOST_PHASES, EngineStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OUTCOMES = ("completed", "cancelled", "rejected", "failed")
TRANSFER_RESOURCES = ("state", "main_kv", "backend_kv")
TRANSFER_DIRECTIONS = ("to_host", "to_device")
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    """Cumulative-bucket histogram with fixed upper bounds (+Inf added)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(bounds) + 1)  # the last bucket is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def family(self, name: str, documentation: str) -> HistogramMetricFamily:
        cumulative, running = [], 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            cumulative.append(("+Inf" if bound == math.inf else repr(bound), running))
        return HistogramMetricFamily(name, documentation, buckets=cumulative, sum_value=self.sum)


class ServerMetrics:
    """Request outcomes and latency histograms, updated once per settled request."""

    def __init__(self) -> None:
        self.requests = dict.fromkeys(OUTCOMES, 0)
        self.response_failures = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.duration = Histogram(DURATION_BUCKETS)
        self.queue = Histogram(QUEUE_BUCKETS)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class MetricsCollector:
    """A prometheus-client collector over `engine.stats()` and the server's ServerMetrics."""

    def __init__(self, engine: Any, server: ServerMetrics, model_id: str) -> None:
        self.engine = engine
        self.server = server
        opts = engine.options
        self.info = {
            "model": model_id,
            "architecture": str(engine.artifact.metadata.get("architecture") or "unknown"),
            "dtype": str(opts.dtype),
            "device": str(opts.device),
        }
        self.max_concurrency = opts.max_concurrency
        self.max_context = opts.max_context

    def describe(self) -> list[Metric]:
        return []  # families are produced at scrape time only

    def collect(self) -> Iterator[Metric]:
        s: EngineStats = self.engine.stats()
        info = GaugeMetricFamily(
            "ninfer_model_info", "Model and backend identity", labels=list(self.info)
        )
        info.add_metric(list(self.info.values()), 1)
        yield info
        yield _gauge("ninfer_max_concurrency", "Resident execution lanes", self.max_concurrency)
        yield _gauge("ninfer_max_context_tokens", "Context ceiling per sequence", self.max_context)
        yield _gauge(
            "ninfer_engine_ready", "1 while the engine accepts work", int(self.engine.core.healthy)
        )
        gauges = {
            "running": "Resident requests",
            "waiting": "Requests waiting for admission",
            "paused": "Resident requests paused for resource pressure",
            "prefilling": "Resident requests processing their prompt",
            "decode_ready": "Resident requests in the decode batch",
            "replaying": "Paused requests rebuilding their state by replay",
            "materializing": "Requests materializing context from host backing",
        }
        for key, doc in gauges.items():
            yield _gauge(f"ninfer_requests_{key}", doc, getattr(s, key))
        tokens = {
            "ninfer_prompt_tokens": ("prompt_tokens", "Prompt tokens, counted once at admission"),
            "ninfer_prompt_tokens_cached": (
                "cached_prompt_tokens",
                "Prompt tokens reused from the prefix cache",
            ),
            "ninfer_prefill_tokens": ("prefill_tokens", "Prompt tokens actually computed"),
            "ninfer_replayed_tokens": ("replayed_tokens", "Tokens recomputed to recover state"),
            "ninfer_generation_tokens": (
                "generation_tokens",
                "Committed output tokens, thinking and inserted control tokens included",
            ),
            "ninfer_decode_tokens": (
                "decode_tokens",
                "Committed output tokens except each request's first (prefill) token",
            ),
            "ninfer_spec_decode_rounds": ("spec_rounds", "Speculative decoding rounds"),
            "ninfer_spec_decode_draft_tokens": ("spec_draft_tokens", "Drafted tokens"),
            "ninfer_spec_decode_accepted_tokens": ("spec_accepted_tokens", "Accepted drafts"),
            "ninfer_spec_decode_fallback_steps": (
                "spec_fallback_steps",
                "Decode steps that fell back to plain decoding",
            ),
            "ninfer_preemptions": ("preemptions", "Requests paused for resource pressure"),
            "ninfer_snapshot_restores": ("snapshot_restores", "Restores from a host snapshot"),
            "ninfer_replay_restores": ("replay_restores", "Restores by replaying tokens"),
        }
        for name, (key, doc) in tokens.items():
            yield _counter(name, doc, getattr(s, key))
        resources = {
            "ninfer_device_kv_used_pages": ("kv_used_pages", "Main KV pages in use"),
            "ninfer_device_kv_capacity_pages": ("kv_capacity_pages", "Main KV pages in the pool"),
            "ninfer_device_state_used_slots": ("state_used_slots", "StateImage slots in use"),
            "ninfer_device_state_capacity_slots": ("state_capacity_slots", "StateImage slots"),
            "ninfer_host_context_used_bytes": ("host_context_used_bytes", "Host context bytes"),
            "ninfer_host_context_reserved_bytes": (
                "host_context_reserved_bytes",
                "Host context bytes reserved for transfers in flight (part of used)",
            ),
            "ninfer_host_context_capacity_bytes": (
                "host_context_capacity_bytes",
                "Host context budget",
            ),
            "ninfer_host_context_peak_bytes": ("host_context_peak_bytes", "Peak host context use"),
        }
        for name, (key, doc) in resources.items():
            yield _gauge(name, doc, getattr(s, key))
        transfers = CounterMetricFamily(
            "ninfer_context_transfer_bytes",
            "Context payload bytes copied between device and host",
            labels=["resource", "direction"],
        )
        for resource in TRANSFER_RESOURCES:
            for direction in TRANSFER_DIRECTIONS:
                # backend_kv (a speculative backend's own KV) does not exist yet: 0
                value = getattr(s, f"transfer_{resource}_{direction}", 0)
                transfers.add_metric([resource, direction], value)
        yield transfers
        host = CounterMetricFamily(
            "ninfer_host_work_seconds", "Engine worker wall time by phase", labels=["phase"]
        )
        for phase in HOST_PHASES:
            host.add_metric([phase], getattr(s, f"host_{phase}_s"))
        yield host
        yield _counter(
            "ninfer_device_wait_seconds", "Worker time blocked on the device", s.device_wait_s
        )
        yield _counter("ninfer_decode_rounds", "Decode batches executed", s.decode_rounds)
        yield _counter(
            "ninfer_decode_row_rounds", "Rows over all decode batches", s.decode_row_rounds
        )
        requests = CounterMetricFamily(
            "ninfer_requests",
            "Generation requests entering preparation, by outcome",
            labels=["outcome"],
        )
        for outcome in OUTCOMES:
            requests.add_metric([outcome], self.server.requests[outcome])
        yield requests
        yield _counter(
            "ninfer_response_failures",
            "Responses that failed after the engine's outcome (delivery, rendering, storage)",
            self.server.response_failures,
        )
        yield self.server.ttft.family(
            "ninfer_time_to_first_token_seconds",
            "From entering preparation to the first committed token",
        )
        yield self.server.duration.family(
            "ninfer_request_duration_seconds", "Settled generation requests, cancellation included"
        )
        yield self.server.queue.family(
            "ninfer_request_queue_seconds", "Submission to admission of settled requests"
        )


def make_registry(collector: MetricsCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
