"""Engine-wide counters and gauges: the worker bumps plain attributes (no lock per token) and
publishes an immutable `EngineStats` once per step and before every terminal event, so whoever
saw a request end sees it counted. Readers (`/metrics`, throughput records) only take snapshots.
No torch, no scheduler import: the core passes numbers in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, fields

# The worker's wall time, split into mutually exclusive phases (spec: host_work{phase}).
# In this engine the model step is synchronous, so program_submit includes the device wait and
# device_wait_seconds stays 0 until the runner separates submission from waiting.
HOST_PHASES = (
    "engine_boundary",  # inbox intake, scheduling, admission and reaped-request terminals
    "program_submit",  # runner.execute: batch building, the model step and sampling
    "program_post",  # post-processing of a step's results outside commit (none yet)
    "engine_commit_output",  # committing sampled tokens: detokenize, stops, events
    "engine_maintenance",  # stats publication
)


@dataclass(frozen=True)
class EngineStats:
    """One published snapshot. Counters are totals since the engine started; gauges are current.

    The speculative counters read zero without `--spec`; the `materializing` gauge is not built
    yet (no request materializes context from host backing): it reads zero.
    """

    published_at: float = 0.0  # time.monotonic() of publication
    num_steps: int = 0
    # gauges: the scheduler's composition (prefilling + replaying + decode_ready == running;
    # paused requests are admitted but not resident)
    running: int = 0
    waiting: int = 0
    paused: int = 0
    prefilling: int = 0
    decode_ready: int = 0
    replaying: int = 0
    materializing: int = 0
    # gauges: resources
    kv_used_pages: int = 0
    kv_capacity_pages: int = 0
    state_used_slots: int = 0
    state_capacity_slots: int = 0
    host_context_used_bytes: int = 0
    host_context_reserved_bytes: int = 0
    host_context_capacity_bytes: int = 0
    host_context_peak_bytes: int = 0
    # counters: tokens
    prompt_tokens: int = 0  # full prompts, counted once at admission
    cached_prompt_tokens: int = 0  # of those, reused from the prefix cache
    prefill_tokens: int = 0  # prompt tokens actually computed
    replayed_tokens: int = 0  # recovery recomputation (replay rows), never in prefill_tokens
    generation_tokens: int = 0  # every committed output token (control tokens included)
    decode_tokens: int = 0  # committed outputs except each request's first (prefill) token
    # counters: scheduling under pressure
    preemptions: int = 0
    snapshot_restores: int = 0
    replay_restores: int = 0
    # counters: device <-> host context copies (bytes), by resource and direction
    transfer_state_to_host: int = 0
    transfer_state_to_device: int = 0
    transfer_main_kv_to_host: int = 0
    transfer_main_kv_to_device: int = 0
    # counters: speculative decoding
    spec_rounds: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_fallback_steps: int = 0
    # counters: decode batches (average batch = row_rounds / rounds)
    decode_rounds: int = 0
    decode_row_rounds: int = 0
    # counters: worker wall time (seconds)
    host_engine_boundary_s: float = 0.0
    host_program_submit_s: float = 0.0
    host_program_post_s: float = 0.0
    host_engine_commit_output_s: float = 0.0
    host_engine_maintenance_s: float = 0.0
    device_wait_s: float = 0.0

    @property
    def host_work_seconds(self) -> dict[str, float]:
        return {phase: getattr(self, f"host_{phase}_s") for phase in HOST_PHASES}

    @property
    def host_work_total_s(self) -> float:
        return sum(self.host_work_seconds.values())


class _Counters:
    """The worker's mutable twin of EngineStats (plain attributes: cheap to bump)."""

    def __init__(self) -> None:
        for f in fields(EngineStats):
            setattr(self, f.name, f.default)


class StatsRecorder:
    def __init__(
        self,
        *,
        kv_capacity_pages: int = 0,
        state_capacity_slots: int = 0,
        host_context_capacity_bytes: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._c = _Counters()
        self._c.kv_capacity_pages = kv_capacity_pages
        self._c.state_capacity_slots = state_capacity_slots
        self._c.host_context_capacity_bytes = host_context_capacity_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._phase: str | None = None
        self._phase_t0 = 0.0
        self._published = EngineStats(**self._c.__dict__)

    # -- worker thread -------------------------------------------------------------------------
    def on_admitted(self, num_prompt: int, num_cached: int = 0) -> None:
        self._c.prompt_tokens += num_prompt
        self._c.cached_prompt_tokens += num_cached

    def on_prefill(self, num_tokens: int) -> None:
        self._c.prefill_tokens += num_tokens

    def set_scheduling(
        self,
        *,
        prefill_tokens: int,
        replayed_tokens: int,
        preemptions: int,
        snapshot_restores: int,
        replay_restores: int,
        transferred: dict[str, dict[str, int]] | None = None,
    ) -> None:
        """Totals the scheduler keeps as its units land (absolute values, not deltas)."""
        c = self._c
        c.prefill_tokens, c.replayed_tokens = prefill_tokens, replayed_tokens
        c.preemptions, c.snapshot_restores = preemptions, snapshot_restores
        c.replay_restores = replay_restores
        for resource, by_direction in (transferred or {}).items():
            for direction, n in by_direction.items():
                setattr(c, f"transfer_{resource}_{direction}", n)

    def set_host_context(self, *, used: int, capacity: int, peak: int) -> None:
        c = self._c
        c.host_context_used_bytes, c.host_context_capacity_bytes = used, capacity
        c.host_context_peak_bytes = max(c.host_context_peak_bytes, peak, used)

    def on_output(self, num_tokens: int, *, first: bool = False) -> None:
        """Committed output tokens; `first`: the token sampled at the end of prefill."""
        self._c.generation_tokens += num_tokens
        if not first:
            self._c.decode_tokens += num_tokens

    def on_spec_step(self, num_drafts: int, num_accepted: int) -> None:
        """One speculative row landed: a round of `num_drafts` drafts, or (0) a fallback step."""
        if num_drafts:
            self._c.spec_rounds += 1
            self._c.spec_draft_tokens += num_drafts
            self._c.spec_accepted_tokens += num_accepted
        else:
            self._c.spec_fallback_steps += 1

    def on_decode_round(self, num_rows: int) -> None:
        self._c.decode_rounds += 1
        self._c.decode_row_rounds += num_rows

    def phase(self, name: str | None) -> None:
        """End the current host phase now and start `name` (None: idle, not counted).

        Phases are exclusive by construction: one clock read closes one and opens the next.
        """
        now = time.perf_counter()
        if self._phase is not None:
            attr = f"host_{self._phase}_s"
            setattr(self._c, attr, getattr(self._c, attr) + now - self._phase_t0)
        self._phase, self._phase_t0 = name, now

    def set_occupancy(
        self,
        *,
        running: int,
        waiting: int,
        prefilling: int,
        kv_used_pages: int,
        state_used_slots: int,
        paused: int = 0,
        replaying: int = 0,
        state_capacity_slots: int | None = None,
    ) -> None:
        c = self._c
        c.running, c.waiting, c.prefilling = running, waiting, prefilling
        c.paused, c.replaying = paused, replaying
        c.decode_ready = running - prefilling - replaying
        c.kv_used_pages, c.state_used_slots = kv_used_pages, state_used_slots
        if state_capacity_slots is not None:
            c.state_capacity_slots = state_capacity_slots

    def publish(self, *, step: bool = False) -> None:
        """Copy the counters into a new immutable snapshot (a few microseconds per step)."""
        resumed = self._phase
        self.phase("engine_maintenance")
        c = self._c
        if step:
            c.num_steps += 1
        c.published_at = self._clock()
        # A frozen dataclass's __init__ sets ~45 fields through object.__setattr__ (~20 us);
        # filling the new instance's __dict__ directly is the same copy at a tenth of the cost.
        snap = object.__new__(EngineStats)
        snap.__dict__.update(c.__dict__)
        with self._lock:
            self._published = snap
        self.phase(resumed)

    # -- any thread ----------------------------------------------------------------------------
    def snapshot(self) -> EngineStats:
        with self._lock:
            return self._published


__all__ = ["HOST_PHASES", "EngineStats", "StatsRecorder"]
