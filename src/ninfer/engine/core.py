"""EngineCore: one worker thread owns the model; any thread submits requests and reads events.

Submission checks capacity synchronously (typed errors reach the caller at once), then hands the
request to the worker through a locked inbox. The worker loops plan -> launch -> land: it plans
and launches step N+1 before it waits for step N's samples (the overlapped loop). `overlap=False`
waits for each step before planning the next, and so does a speculative engine unless every
round of the step can chain its next one (`Scheduler.may_plan_ahead`). `Scheduler.update`
commits what landed. The core executes plans and routes events; it never mutates scheduler
state itself. Events go to each request's sink on the worker thread; sinks must not block (the
handles in `handles.py` queue them for blocking iterators or an asyncio loop).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from ninfer.engine.errors import (
    EngineClosed,
    EngineFailed,
    InvalidRequest,
    QueueTimeout,
    ServerOverloaded,
)
from ninfer.engine.output import OutputState
from ninfer.engine.plan import Launched, Runner
from ninfer.engine.request import EngineEvent, EventKind, GenerationRequest, RequestStats
from ninfer.engine.sampling import SamplingParamError, SamplingParams
from ninfer.engine.scheduler import Event, Scheduler, SeqStatus, Sequence, SpecCounts
from ninfer.engine.stats import EngineStats, StatsRecorder
from ninfer.engine.stops import StopStringError
from ninfer.engine.thinking_budget import ThinkingBudget, ThinkingControl
from ninfer.tokenizer import Tokenizer

Sink = Callable[[EngineEvent], None]
MAX_STOP_STRINGS = 4
log = logging.getLogger("ninfer.engine")


@dataclass
class _Live:
    seq: Sequence
    sink: Sink


class EngineCore:
    def __init__(
        self,
        scheduler: Scheduler,
        runner: Runner,
        tokenizer: Tokenizer,
        *,
        eos_token_ids: frozenset[int],
        resolve_sampling: Callable[[GenerationRequest], SamplingParams],
        overlap: bool = True,
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.overlap = overlap
        self._resolve_sampling = resolve_sampling
        self.thinking_control = ThinkingControl.from_tokenizer(tokenizer)
        # Every request's detokenizer reads one byte table built from the whole vocabulary
        # (~0.5 s for Qwen3.5): build it now, not inside the first submit, which runs on the
        # caller's event loop and inside that request's pending deadline.
        _ = tokenizer.byte_table
        self._lock = threading.Condition()
        self._inbox: list[_Live] = []
        self._cancels: set[str] = set()
        self._live: dict[str, _Live] = {}
        self._num_live = 0  # submitted and not yet terminal (inbox included)
        self._ids = itertools.count()
        self._closed = False
        self.failure: BaseException | None = None
        # [stats] engine-wide counters; published by the worker, read through stats()
        images = scheduler.images
        self._stats = StatsRecorder(
            kv_capacity_pages=scheduler.pages.num_pages,
            state_capacity_slots=scheduler.slots.num_slots
            + (len(images.slots) if images is not None else 0),
            host_context_capacity_bytes=images.host.budget if images is not None else 0,
        )
        self._thread = threading.Thread(target=self._run, name="ninfer-engine", daemon=True)
        self._thread.start()

    # -- any thread ----------------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return self.failure is None and not self._closed

    def stats(self) -> EngineStats:
        """The latest published counters and gauges (immutable; safe from any thread)."""
        return self._stats.snapshot()

    def submit(self, request: GenerationRequest, sink: Sink) -> str:
        """Queue a request; raises a typed EngineError at once when it cannot be taken."""
        if request.max_tokens < 0:
            raise InvalidRequest(f"max_tokens must be >= 0, got {request.max_tokens}")
        if len(request.stop) > MAX_STOP_STRINGS:
            raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings are supported")
        if not request.prompt_ids:
            raise InvalidRequest("the prompt is empty")
        try:
            sampling = self._resolve_sampling(request)
            sampling.validate()
        except SamplingParamError as e:
            raise InvalidRequest(str(e)) from e
        self.scheduler.check_fits(len(request.prompt_ids), request.max_tokens)
        stop_ids = request.stop_token_ids
        if stop_ids is None:
            stop_ids = frozenset() if request.ignore_eos else self.eos_token_ids
        try:
            output = OutputState(
                self.tokenizer,
                stop_token_ids=stop_ids,
                stop_strings=request.stop,
                max_tokens=request.max_tokens,
                max_context=self.scheduler.config.max_context,
            )
        except StopStringError as e:
            raise InvalidRequest(str(e)) from e
        budget = self._thinking_budget(request)
        now = time.monotonic()
        timeout = request.pending_timeout_s
        request_id = request.request_id or f"req-{next(self._ids)}"
        seq = Sequence(
            request_id=request_id,
            request=request,
            sampling=sampling,
            token_ids=list(request.prompt_ids),
            num_prompt=len(request.prompt_ids),
            arrival=now,
            deadline=now
            + (self.scheduler.config.pending_timeout_s if timeout is None else timeout),
            output=output,
            budget=budget,
        )
        k = self.scheduler.config.draft_tokens
        if k:
            seq.spec = SpecCounts(draft_window=k, accepted_per_position=[0] * k)
        with self._lock:
            if self._closed or self.failure is not None:
                raise EngineClosed("the engine is not running")
            limit = self.scheduler.config.max_concurrency + self.scheduler.config.max_pending
            if self._num_live >= limit:
                raise ServerOverloaded(
                    f"{self._num_live} requests are running or waiting (limit {limit})"
                )
            if request_id in self._live or any(x.seq.request_id == request_id for x in self._inbox):
                raise InvalidRequest(f"request id {request_id!r} is already in use")
            self._num_live += 1
            self._inbox.append(_Live(seq, sink))
            self._lock.notify()
        return request_id

    def _thinking_budget(self, request: GenerationRequest) -> ThinkingBudget | None:
        budget = request.thinking_budget
        if budget is None:
            return None
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise InvalidRequest(f"thinking_budget must be a positive integer, got {budget!r}")
        if self.thinking_control is None:
            raise InvalidRequest("this tokenizer has no </think> token: no thinking budget")
        max_context = self.scheduler.config.max_context
        num_capacity = min(request.max_tokens, max_context - len(request.prompt_ids))
        self.thinking_control.check_capacity(budget, num_capacity)
        return ThinkingBudget(budget, self.thinking_control)

    def cancel(self, request_id: str) -> None:
        """Cancel at any point (waiting, prefilling or decoding); a no-op once finished."""
        with self._lock:
            self._cancels.add(request_id)
            self._lock.notify()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=30)

    # -- worker thread -------------------------------------------------------------------------
    def _run(self) -> None:
        inflight: Launched | None = None
        try:
            while True:
                self._stats.phase("engine_boundary")
                if not self._intake():
                    break
                plan, events = self.scheduler.schedule()
                self._deliver(events)
                self._publish_stats(step=not plan.is_empty)  # once per loop
                self._stats.phase("program_submit")
                launched = None if plan.is_empty else self.runner.launch(plan)
                landed = inflight is not None
                if inflight is not None:  # step N lands while step N+1 runs on the device
                    self._land(inflight)
                inflight = launched
                if inflight is not None and not self._plan_ahead(inflight):
                    self._land(inflight)
                    inflight, landed = None, True
                if inflight is None and not landed and plan.is_empty:
                    self._stats.phase(None)  # idle time is not host work
                    self._idle_wait()
            if inflight is not None:
                inflight.wait()  # the device is done with every buffer before requests fail
            self._fail_all(EngineClosed("the engine was closed"))
        except BaseException as e:  # engine-wide failure: every live request learns of it
            log.exception("engine failure")
            self.failure = e
            self._fail_all(e)

    def _plan_ahead(self, launched: Launched) -> bool:
        """Whether the next step is planned before `launched` lands (the overlapped loop)."""
        return self.overlap and self.scheduler.may_plan_ahead(launched.plan)

    def _land(self, launched: Launched) -> None:
        outcome = launched.wait()
        self._stats.phase("engine_commit_output")
        plan = launched.plan
        if plan.decode:
            self._stats.on_decode_round(len(plan.decode))
        for i, row in enumerate(plan.decode):
            # (a chained round behind one that finished its request is discarded: not counted)
            if row.spec and row.seq.status != SeqStatus.FINISHED:
                self._stats.on_spec_step(row.num_drafts, outcome.accepted[i])
        self._deliver(self.scheduler.update(plan, outcome))

    def _intake(self) -> bool:
        with self._lock:
            if self._closed:
                return False
            inbox, self._inbox = self._inbox, []
            cancels, self._cancels = self._cancels, set()
        for live in inbox:
            self._live[live.seq.request_id] = live
            self.scheduler.enqueue(live.seq)
        for request_id in cancels:
            live = self._live.get(request_id)
            if live is not None:
                live.seq.cancelled = True
        return True

    def _deliver(self, events: list[Event]) -> None:
        for seq, event in events:
            live = self._live.get(seq.request_id)
            if live is None:
                continue
            if event.kind == EventKind.ADMITTED:
                self._stats.on_admitted(seq.num_prompt, seq.num_cached)
                event.stats = _request_stats(seq, terminal=False)
            elif event.kind == EventKind.TOKENS:
                if event.num_control:
                    self._stats.on_output(event.num_control)
                else:
                    self._stats.on_output(len(event.token_ids), first=event.num_output == 1)
            if event.is_terminal:
                del self._live[seq.request_id]
                with self._lock:
                    self._num_live -= 1
                # published before the terminal event: whoever sees the end sees it counted
                self._publish_stats()
                event.stats = _request_stats(seq, terminal=True)
            self._emit(live, event)

    def _publish_stats(self, *, step: bool = False) -> None:
        """Current scheduler composition and pool occupancy, then one snapshot."""
        s = self.scheduler
        replaying = sum(1 for seq in s.running if seq.recovery.replaying)
        images = s.images
        state_used = s.slots.num_slots - s.slots.num_free
        state_capacity = s.slots.num_slots
        if images is not None:  # retained StateImages occupy device slots too
            state_used += len(images.slots) - images.num_free
            state_capacity += len(images.slots)
            self._stats.set_host_context(
                used=images.host.used, capacity=images.host.budget, peak=images.peak_host_bytes
            )
        self._stats.set_occupancy(
            running=len(s.running),
            waiting=len(s.waiting),
            prefilling=sum(
                1 for seq in s.running if seq.is_prefilling and not seq.recovery.replaying
            ),
            kv_used_pages=s.pages.num_pages - s.pages.num_free,
            state_used_slots=state_used,
            paused=len(s.paused),
            replaying=replaying,
            state_capacity_slots=state_capacity,
        )
        self._stats.set_scheduling(
            prefill_tokens=s.work.prefill,
            replayed_tokens=s.work.replay,
            preemptions=s.num_preemptions,
            snapshot_restores=s.num_snapshot_restores,
            replay_restores=s.num_replay_restores,
            transferred=images.transferred if images is not None else None,
        )
        self._stats.publish(step=step)

    def _emit(self, live: _Live, event: EngineEvent) -> None:
        """Deliver one event; a consumer that fails (e.g. its event loop closed) is cancelled,
        never the engine: one broken client must not cost the other requests their work."""
        try:
            live.sink(event)
        except Exception:
            log.warning("request %s: event consumer failed; cancelling it", live.seq.request_id)
            live.seq.cancelled = True

    def _idle_wait(self) -> None:
        with self._lock:
            if self._inbox or self._cancels or self._closed:
                return
            deadlines = [s.deadline for s in self.scheduler.waiting]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            self._lock.wait(timeout)

    def _fail_all(self, error: BaseException) -> None:
        wrapped = error if isinstance(error, EngineClosed) else EngineFailed(str(error))
        with self._lock:
            inbox, self._inbox = self._inbox, []
        for live in inbox:
            self._live[live.seq.request_id] = live
            self.scheduler.enqueue(live.seq)
        for live in list(self._live.values()):
            self._deliver(self.scheduler.fail(live.seq, wrapped))


def _request_stats(seq: Sequence, *, terminal: bool) -> RequestStats:
    """The per-request facts the server logs (request_done.engine_timing)."""
    rec = seq.recovery
    return RequestStats(
        t_submitted=seq.arrival,
        t_admitted=seq.t_admitted,
        t_first_token=seq.t_first_token,
        t_last_token=seq.t_last_token,
        t_finished=time.monotonic() if terminal else None,
        num_prefill_tokens=max(0, min(seq.num_computed, seq.num_prompt) - seq.num_cached),
        num_cached_tokens=seq.num_cached,
        output_ids=tuple(seq.output_ids) if terminal else (),
        sampling=asdict(seq.sampling) if terminal else {},
        num_preemptions=rec.preemptions,
        num_snapshot_restores=rec.snapshot_restores,
        num_replay_restores=rec.replay_restores,
        num_replayed_tokens=rec.replayed_tokens,
        paused_s=rec.paused_s,
        transfer_bytes={k: dict(v) for k, v in rec.transfer.items()},
        speculative=_speculative(seq) if terminal else None,
    )


def _speculative(seq: Sequence) -> dict | None:
    """request_done.speculative of a speculative engine's request (None without one)."""
    s = seq.spec
    if s is None:
        return None
    return {
        "backend": "mtp",
        "draft_window": s.draft_window,
        "rounds": s.rounds,
        "drafted_tokens": s.drafted_tokens,
        "accepted_tokens": s.accepted_tokens,
        "fallback_steps": s.fallback_steps,
        "accepted_per_position": list(s.accepted_per_position),
    }


__all__ = ["EngineCore", "QueueTimeout"]
