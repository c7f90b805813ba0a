"""The JSONL request events (request_rejected, request_done, request_error) and the stage times
they share with the metrics. Pure functions: the lifecycle decides when a request settles, this
module what its record holds (counts, options and times, never text).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer.api import ChatEvent
from ninfer.chat.output_decoder import ToolCallParseStats
from ninfer.engine.request import RequestStats, SchedulingTransition
from ninfer.protocol.errors import ProtocolError

# Without a speculative backend (no --spec) request_done.speculative is present and zero.
SPECULATIVE_OFF = {
    "backend": None,
    "draft_window": 0,
    "rounds": 0,
    "drafted_tokens": 0,
    "accepted_tokens": 0,
    "fallback_steps": 0,
    "accepted_per_position": [],
}
TRANSFER_RESOURCES = ("state", "main_kv")
TRANSFER_DIRECTIONS = ("to_host", "to_device")


@dataclass(frozen=True)
class StageTimes:
    """A request's stages in seconds; None where the stage did not happen."""

    prepare: float  # entering preparation -> engine submission
    ttft: float | None  # entering preparation -> first committed token
    queue_wait: float  # submission -> admission (-> the end when never admitted)
    prefill: float | None  # admission -> first token (-> the end without output)
    decode: float | None  # first -> last committed token
    resident: float | None  # admission -> the end

    @classmethod
    def of(
        cls, stats: RequestStats | None, t_start: float, t_submitted: float | None, end: float
    ) -> StageTimes:
        """From the engine's monotonic instants, measured against the lifecycle's own start."""
        if stats is None:
            prepare = (t_submitted or end) - t_start
            return cls(prepare, None, 0.0, None, None, None)
        first, last = stats.t_first_token, stats.t_last_token
        has_output = bool(stats.output_ids) and first is not None
        admitted, finished = stats.t_admitted, stats.t_finished or end
        ttft = first - t_start if has_output and first is not None else None
        queue = (admitted if admitted is not None else finished) - stats.t_submitted
        if admitted is None:
            return cls(stats.t_submitted - t_start, ttft, queue, None, None, None)
        prefill = (first if has_output and first is not None else finished) - admitted
        decode = last - first if has_output and first is not None and last is not None else 0.0
        return cls(stats.t_submitted - t_start, ttft, queue, prefill, decode, finished - admitted)


def scheduling_json(stats: RequestStats | None) -> dict[str, Any]:
    """request_done.scheduling: how resource pressure treated this request."""
    moved = stats.transfer_bytes if stats is not None else {}
    transfer = {
        r: {d: int(moved.get(r, {}).get(d, 0)) for d in TRANSFER_DIRECTIONS}
        for r in TRANSFER_RESOURCES
    }
    s = stats or RequestStats(t_submitted=0.0)
    return {
        "preemptions": s.num_preemptions,
        "snapshot_restores": s.num_snapshot_restores,
        "replay_restores": s.num_replay_restores,
        "replayed_tokens": s.num_replayed_tokens,
        "paused_seconds": s.paused_s,
        "transfer_bytes": transfer,
    }


def scheduling_body(request_id: str, boundary: SchedulingTransition) -> dict[str, Any]:
    """request_scheduling: one pause-cycle boundary with the landed-work counters."""
    return {
        "request_id": request_id,
        "transition": boundary.transition,
        "preemption_index": boundary.preemption_index,
        "route": boundary.route,
        "steady_ns": boundary.steady_ns,
        "elapsed_ns": boundary.elapsed_ns,
        "progress": {k: dict(v) for k, v in boundary.progress.items()},
    }


def prefix_fields(header: str | None, cached: int) -> dict[str, Any]:
    """prefix_reuse_path ("checkpoint" on a hit, "root" for a full prefill, None when reuse
    is off) and the miss reason the x-ninfer-prefix-cache header gave."""
    if cached > 0:
        return {"prefix_reuse_path": "checkpoint", "prefix_cache_miss_reason": None}
    miss = None
    for part in (header or "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == "miss":
            miss = value
    path = None if miss == "disabled" else "root"
    return {"prefix_reuse_path": path, "prefix_cache_miss_reason": miss}


def error_fields(error: ProtocolError) -> dict[str, Any]:
    return {"status": error.status, "type": error.type, "code": error.code,
            "message": error.message}  # fmt: skip


def rejected_body(base: dict[str, Any], error: ProtocolError, total: float) -> dict[str, Any]:
    """request_rejected: preparation failed; no request_start was written."""
    return {**base, "phase": "prepare", **error_fields(error), "param": error.param,
            "prepare_seconds": total}  # fmt: skip


def error_body(
    base: dict[str, Any],
    error: ProtocolError,
    *,
    delivery: str | None,
    admitted: RequestStats | None,
    prompt_tokens: int,
    prepare: float,
    total: float,
) -> dict[str, Any]:
    """request_error: generation failed before the engine had an outcome."""
    return {
        **base,
        "phase": "generation" if admitted is not None else "queue",
        **error_fields(error),
        "delivery": delivery,
        "prompt_tokens": prompt_tokens,
        "timings_seconds": {"prepare": prepare, "total": total},
        "engine_timing": {
            "queue_wait_seconds": admitted.queue_wait_s if admitted is not None else None
        },
    }


def tool_parse_json(parse: ToolCallParseStats | None) -> dict[str, Any]:
    parse = parse or ToolCallParseStats()
    return {
        "marker_seen": parse.marker_seen,
        "num_calls": parse.num_calls,
        "num_empty_omitted": parse.num_empty_omitted,
        "num_mismatched_preserved": parse.num_mismatched_preserved,
        "fallback_reason": parse.fallback_reason.value,
    }


def done_body(
    base: dict[str, Any],
    finished: ChatEvent,
    times: StageTimes,
    *,
    status: int,
    delivery: str | None,
    response_failure: ProtocolError | None,
    num_tool_calls: int,
    total: float,
) -> dict[str, Any]:
    """request_done: the engine's outcome (finished or cancelled) and how its response went."""
    usage, stats = finished.usage, finished.stats
    assert usage is not None
    reason = finished.finish_reason.value if finished.finish_reason is not None else "stop"
    return {
        **base,
        "status": status,
        "delivery": delivery,
        "response_failure": response_failure.code if response_failure is not None else None,
        "finish_reason": reason,
        "usage": {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens,
            "computed_prefill_tokens": stats.num_prefill_tokens if stats else 0,
            "reasoning_tokens": usage.reasoning_tokens,
        },
        "prefix_cache_hit_tokens": stats.num_cached_tokens if stats else 0,
        **prefix_fields(finished.prefix_cache, stats.num_cached_tokens if stats else 0),
        "result": {
            "generated_token_ids": list(stats.output_ids) if stats else [],
            "num_tool_calls": num_tool_calls,
            "tool_call_parse": tool_parse_json(finished.tool_parse),
        },
        "timings_seconds": {
            "prepare": times.prepare,
            "ttft": times.ttft,
            "vision": 0.0,
            "prefill": times.prefill,
            "decode": times.decode,
            "total": total,
        },
        "engine_timing": {
            "queue_wait_seconds": times.queue_wait,
            "admitted": times.resident is not None,
            "resident_seconds": times.resident,
        },
        "speculative": dict(stats.speculative)
        if stats is not None and stats.speculative is not None
        else dict(SPECULATIVE_OFF),
        "scheduling": scheduling_json(stats),
        "sampling": dict(stats.sampling) if stats else {},
    }
