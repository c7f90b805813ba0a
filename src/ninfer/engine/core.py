"""EngineCore: one worker thread owns the model; any thread submits requests and reads events.

Submission checks capacity synchronously (typed errors reach the caller at once), then hands the
request to the worker through a locked inbox. The worker loops: drain the inbox, schedule, execute,
commit. Events go to each request's sink on the worker thread; sinks must not block (the handles
in `handles.py` queue them for blocking iterators or an asyncio loop).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ninfer.engine.errors import (
    EngineClosed,
    EngineFailed,
    InvalidRequest,
    QueueTimeout,
    ServerOverloaded,
)
from ninfer.engine.output import OutputState
from ninfer.engine.request import (
    EngineEvent,
    EventKind,
    FinishReason,
    GenerationRequest,
    Timings,
    Usage,
)
from ninfer.engine.runner import ModelRunner, StepResult
from ninfer.engine.sampling import SamplingParamError, SamplingParams
from ninfer.engine.scheduler import Scheduler, Sequence, StepPlan
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
    output: OutputState
    budget: ThinkingBudget | None = None


class EngineCore:
    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        tokenizer: Tokenizer,
        *,
        eos_token_ids: frozenset[int],
        resolve_sampling: Callable[[GenerationRequest], SamplingParams],
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
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
        self._thread = threading.Thread(target=self._run, name="ninfer-engine", daemon=True)
        self._thread.start()

    # -- any thread ----------------------------------------------------------------------------
    @property
    def healthy(self) -> bool:
        return self.failure is None and not self._closed

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
        )
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
            self._inbox.append(_Live(seq, sink, output, budget))
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
        try:
            while True:
                if not self._intake():
                    break
                plan, finishes = self.scheduler.schedule()
                for seq, why in finishes:
                    self._terminal(seq, why)
                self._announce_admissions()
                if plan.is_empty:
                    self._idle_wait()
                    continue
                result = self.runner.execute(plan)
                self._commit(plan, result)
        except BaseException as e:  # engine-wide failure: every live request learns of it
            log.exception("engine failure")
            self.failure = e
            self._fail_all(e)

    def _intake(self) -> bool:
        with self._lock:
            if self._closed:
                self._fail_all(EngineClosed("the engine was closed"))
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

    def _emit(self, live: _Live, event: EngineEvent) -> None:
        """Deliver one event; a consumer that fails (e.g. its event loop closed) is cancelled,
        never the engine: one broken client must not cost the other requests their work."""
        try:
            live.sink(event)
        except Exception:
            log.warning("request %s: event consumer failed; cancelling it", live.seq.request_id)
            live.seq.cancelled = True

    def _announce_admissions(self) -> None:
        admitted, self.scheduler.just_admitted = self.scheduler.just_admitted, []
        for seq in admitted:
            live = self._live.get(seq.request_id)
            if live is not None and seq.slot is not None:
                self._emit(
                    live, EngineEvent(seq.request_id, EventKind.ADMITTED, num_prompt=seq.num_prompt)
                )

    def _idle_wait(self) -> None:
        with self._lock:
            if self._inbox or self._cancels or self._closed:
                return
            deadlines = [s.deadline for s in self.scheduler.waiting]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            self._lock.wait(timeout)

    def _commit(self, plan: StepPlan, result: StepResult) -> None:
        now = time.monotonic()
        if plan.prefill is not None:
            unit = plan.prefill
            seq = unit.seq
            seq.num_computed += unit.num_tokens
            live = self._live[seq.request_id]
            self._emit(
                live,
                EngineEvent(
                    seq.request_id,
                    EventKind.PROGRESS,
                    num_processed=seq.num_computed,
                    num_prompt=seq.num_prompt,
                ),
            )
            if unit.samples:
                self._commit_token(seq, result.sampled[id(seq)], now)
            elif not seq.is_prefilling:  # max_tokens == 0: the prompt is processed, nothing more
                seq.t_first_token = now
                self._terminal(seq, FinishReason.LENGTH)
        for seq in plan.decode:
            seq.num_computed += 1
            if seq.num_computed < len(seq.token_ids):
                continue  # the row fed an inserted control token: its sample is not wanted
            self._commit_token(seq, result.sampled[id(seq)], now)

    def _commit_token(self, seq: Sequence, token_id: int, now: float) -> None:
        live = self._live[seq.request_id]
        if seq.cancelled:  # two-phase commit: a cancelled row commits nothing
            self._terminal(seq, FinishReason.CANCELLED)
            return
        seq.token_ids.append(token_id)
        if seq.t_first_token is None:
            seq.t_first_token = now
        seq.t_last_token = now
        commit = live.output.commit(token_id, seq.num_output, len(seq.token_ids))
        self._emit(
            live,
            EngineEvent(
                seq.request_id,
                EventKind.TOKENS,
                [token_id],
                commit.text,
                num_prompt=seq.num_prompt,
                num_output=seq.num_output,
            ),
        )
        if commit.finish is not None:
            self._terminal(seq, commit.finish, flush=False)
        elif live.budget is not None:
            self._insert_control(live, live.budget.after_commit(token_id, seq.num_output))

    def _insert_control(self, live: _Live, control_ids: tuple[int, ...]) -> None:
        """Commit control tokens without sampling. They join `token_ids` uncomputed; the next
        decode steps feed them one per step (discarding those samples) before sampling again."""
        if not control_ids:
            return
        seq = live.seq
        seq.token_ids.extend(control_ids)
        self._emit(
            live,
            EngineEvent(
                seq.request_id,
                EventKind.TOKENS,
                list(control_ids),
                live.output.commit_control(control_ids),
                num_prompt=seq.num_prompt,
                num_output=seq.num_output,
                num_control=len(control_ids),
            ),
        )

    def _terminal(
        self, seq: Sequence, why: FinishReason | BaseException, flush: bool = True
    ) -> None:
        live = self._live.pop(seq.request_id, None)
        self.scheduler.finish(seq)
        if live is None:
            return
        with self._lock:
            self._num_live -= 1
        if isinstance(why, BaseException):
            self._emit(live, EngineEvent(seq.request_id, EventKind.ERROR, error=why))
            return
        text = live.output.finish() if flush else ""
        self._emit(
            live,
            EngineEvent(
                seq.request_id,
                EventKind.FINISHED,
                text=text,
                finish_reason=why,
                usage=Usage(seq.num_prompt, seq.num_output),
                timings=_timings(seq),
                stop_string=live.output.stop_string,
            ),
        )

    def _fail_all(self, error: BaseException) -> None:
        wrapped = error if isinstance(error, EngineClosed) else EngineFailed(str(error))
        with self._lock:
            inbox, self._inbox = self._inbox, []
        for live in inbox:
            self._live[live.seq.request_id] = live
            self.scheduler.enqueue(live.seq)
        for live in list(self._live.values()):
            self._terminal(live.seq, wrapped)


def _timings(seq: Sequence) -> Timings:
    start = seq.t_admitted or seq.arrival
    first = seq.t_first_token
    prompt_ms = (first - start) * 1000.0 if first is not None else 0.0
    last = seq.t_last_token
    predicted_ms = (last - first) * 1000.0 if first is not None and last is not None else 0.0
    return Timings(
        cache_n=0,
        prompt_n=seq.num_prompt,
        prompt_ms=prompt_ms,
        predicted_n=seq.num_output,
        predicted_ms=predicted_ms,
    )


__all__ = ["EngineCore", "QueueTimeout"]
