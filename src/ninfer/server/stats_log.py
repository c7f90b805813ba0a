"""`--log-stats-interval-ms N`: a throughput record every N ms on absolute deadlines, diffing two
published `EngineStats` snapshots; fully idle intervals are omitted. The stderr line is plain text
(no terminal control sequences); the JSONL `throughput` record has full precision. No sanic.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from ninfer.engine.stats import HOST_PHASES, EngineStats
from ninfer.server.request_log import RequestLog

log = logging.getLogger("ninfer.server")
GAUGES = (
    "running",
    "prefilling",
    "decode_ready",
    "waiting",
    "paused",
    "replaying",
    "materializing",
)


def throughput_body(
    old: EngineStats, new: EngineStats, elapsed_s: float, interval_ms: int
) -> dict[str, Any] | None:
    """The JSONL `throughput` body for one interval, or None when it was fully idle."""

    def delta(name: str) -> Any:
        return getattr(new, name) - getattr(old, name)

    tokens = {
        "prompt": delta("prompt_tokens"),
        "cached": delta("cached_prompt_tokens"),
        "prefill": delta("prefill_tokens"),
        "replayed": delta("replayed_tokens"),
        "generation": delta("generation_tokens"),
        "decode": delta("decode_tokens"),
    }
    rounds, row_rounds = delta("decode_rounds"), delta("decode_row_rounds")
    gauges = {name: getattr(new, name) for name in GAUGES}
    busy = any(tokens.values()) or rounds or new.running or new.waiting or new.paused
    if not busy:
        return None
    host = {phase: delta(f"host_{phase}_s") for phase in HOST_PHASES}
    host_total = sum(host.values())

    def rate(n: float) -> float:
        return n / elapsed_s if elapsed_s > 0 else 0.0

    return {
        "interval_seconds": elapsed_s,
        "configured_interval_ms": interval_ms,
        "tokens": tokens,
        "rates": {
            "prefill_tokens_per_second": rate(tokens["prefill"]),
            "decode_tokens_per_second": rate(tokens["decode"]),
            "generation_tokens_per_second": rate(tokens["generation"]),
        },
        "scheduler": gauges,
        "decode_batch": {
            "rounds": rounds,
            "row_rounds": row_rounds,
            "average_size": row_rounds / rounds if rounds else None,
        },
        "host_work": {
            "elapsed_seconds": {**host, "total": host_total},
            "device_wait_seconds": delta("device_wait_s"),
            "active_fraction": host_total / elapsed_s if elapsed_s > 0 else None,
        },
        "scheduling": {
            "preemptions": delta("preemptions"),
            "snapshot_restores": delta("snapshot_restores"),
            "replay_restores": delta("replay_restores"),
            "replayed_tokens": tokens["replayed"],
        },
        "speculative": {
            "rounds": delta("spec_rounds"),
            "draft_tokens": delta("spec_draft_tokens"),
            "accepted_tokens": delta("spec_accepted_tokens"),
            "fallback_steps": delta("spec_fallback_steps"),
        },
        "resources": {
            "kv_used_pages": new.kv_used_pages,
            "kv_capacity_pages": new.kv_capacity_pages,
            "state_used_slots": new.state_used_slots,
            "state_capacity_slots": new.state_capacity_slots,
            "host_context_used_bytes": new.host_context_used_bytes,
        },
    }


def pretty(body: dict[str, Any]) -> str:
    """The stderr record: nonzero token work, composition, batch and host-active time."""
    tokens, rates, g = body["tokens"], body["rates"], body["scheduler"]
    parts = [f"throughput {body['interval_seconds']:.1f}s"]
    if tokens["prefill"]:
        parts.append(
            f"prefill {tokens['prefill']:,} tok {rates['prefill_tokens_per_second']:,.1f} tok/s"
        )
    if tokens["decode"]:
        parts.append(
            f"decode {tokens['decode']:,} tok {rates['decode_tokens_per_second']:,.1f} tok/s"
        )
    parts.append(
        f"running {g['running']} (prefilling {g['prefilling']}, decode-ready {g['decode_ready']})"
    )
    parts += [f"{name} {g[name]}" for name in GAUGES[3:] if g[name]]
    size = body["decode_batch"]["average_size"]
    if size is not None:
        parts.append(f"batch {size:.2f}")
    host = body["host_work"]
    fraction = host["active_fraction"]
    share = f" {fraction * 100:.1f}%" if fraction is not None else ""
    parts.append(f"host {host['elapsed_seconds']['total']:.2f}s{share}")
    return " | ".join(parts)


class ThroughputReporter:
    def __init__(
        self,
        stats: Callable[[], EngineStats],
        interval_ms: int,
        request_log: RequestLog,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stats = stats
        self.interval_ms = interval_ms
        self.request_log = request_log
        self.clock = clock
        self._last = stats()
        self._t_last = clock()

    def tick(self) -> dict[str, Any] | None:
        """Close the current interval: log and record it unless it was idle."""
        now, snap = self.clock(), self.stats()
        body = throughput_body(self._last, snap, now - self._t_last, self.interval_ms)
        self._last, self._t_last = snap, now
        if body is not None:
            log.info("%s", pretty(body))
            self.request_log.write("throughput", body)
        return body

    async def run(self) -> None:
        """Tick on absolute deadlines until cancelled; a late tick skips missed deadlines."""
        interval = self.interval_ms / 1000.0
        start = self._t_last
        k = 1
        while True:
            await asyncio.sleep(max(0.0, start + k * interval - self.clock()))
            self.tick()
            k = max(k + 1, math.floor((self.clock() - start) / interval) + 1)
