"""Pause and recovery bookkeeping: landed work counters and one request's pause cycles.

No tensors, no scheduler import: the scheduler owns one `Work` for the whole engine and one
`Recovery` per sequence and calls these as its units land, pause and resume. They exist so the
observability layer can answer "how much did pressure cost this request, and did other requests
advance while it replayed?" from exact counts instead of periodic gauges (spec: request_done's
scheduling object, the request_scheduling JSONL events, `ninfer_*_restores_total`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ninfer.engine.request import SchedulingTransition

SNAPSHOT = "snapshot"
REPLAY = "replay"
TRANSFER_RESOURCES = ("state", "main_kv")
TRANSFER_DIRECTIONS = ("to_host", "to_device")


@dataclass
class Work:
    """Tokens whose units have landed: fresh prompt prefill, committed decode/control output
    (each request's first output token is prefill's and is not counted), and replay (state
    rebuilt below a frontier the request had already reached)."""

    prefill: int = 0
    decode: int = 0
    replay: int = 0

    def to_dict(self) -> dict[str, int]:
        return {"prefill": self.prefill, "decode": self.decode, "replay": self.replay}


def split_prefill_row(start: int, end: int, num_prompt: int, replay_to: int) -> tuple[int, int]:
    """(fresh prompt tokens, replayed tokens) of a prefill row over [start, end): positions
    below `replay_to` are a replay; the rest of the prompt is fresh prefill."""
    replay = max(0, min(end, replay_to) - start)
    fresh = max(0, min(end, num_prompt) - max(start, replay_to))
    return fresh, replay


def transfer_bytes() -> dict[str, dict[str, int]]:
    return {r: dict.fromkeys(TRANSFER_DIRECTIONS, 0) for r in TRANSFER_RESOURCES}


@dataclass
class Recovery:
    """One request's pause cycles: counts, paused time, request-owned transfers, and where the
    current cycle stands (which transition comes next)."""

    enabled: bool = False  # emit SchedulingTransitions (only with request logging)
    preemptions: int = 0
    snapshot_restores: int = 0
    replay_restores: int = 0
    paused_s: float = 0.0
    work: Work = field(default_factory=Work)
    transfer: dict[str, dict[str, int]] = field(default_factory=transfer_bytes)
    route: str | None = None  # the current (or last) cycle's route
    t_paused: float | None = None  # PAUSED since
    replaying: bool = False  # resumed by replay, the rebuilt frontier not reached yet
    recovering: bool = False  # resumed, no fresh unit landed yet

    @property
    def replayed_tokens(self) -> int:
        return self.work.replay

    def add_transfer(self, resource: str, direction: str, num_bytes: int) -> None:
        self.transfer[resource][direction] += num_bytes

    def end_pause(self, now: float) -> None:
        """The paused interval ends (restored, or the request ended while paused)."""
        if self.t_paused is not None:
            self.paused_s += max(0.0, now - self.t_paused)
            self.t_paused = None

    def transition(
        self, name: str, now: float, arrival: float, engine: Work
    ) -> SchedulingTransition:
        """A boundary of the current cycle, with the global and this request's landed work."""
        return SchedulingTransition(
            transition=name,
            preemption_index=max(0, self.preemptions - 1),
            route=self.route,
            steady_ns=int(now * 1e9),
            elapsed_ns=max(0, int((now - arrival) * 1e9)),
            progress={"global": engine.to_dict(), "request": self.work.to_dict()},
        )


__all__ = [
    "REPLAY",
    "SNAPSHOT",
    "Recovery",
    "Work",
    "split_prefill_row",
    "transfer_bytes",
]
