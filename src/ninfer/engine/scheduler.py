"""The scheduler: admission, resource reservation and the step plan. No tensors, no model.

Each step is `plan = schedule()`, `result = runner.execute(plan)`, `update(plan, result)`. A plan
holds at most one prefill chunk (the oldest request still prefilling) and one compact decode batch
(every decode-ready request, rebuilt each step, never with empty rows). Pages are reserved before a
unit is planned; a decode row that cannot get its page finishes with reason `context`. Admission is
FIFO; when the head cannot fit, up to `max_bypass` younger requests may pass it, then none until
the head is admitted. All bookkeeping runs on the engine's worker thread.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ninfer.engine.errors import ContextLengthExceeded, QueueTimeout
from ninfer.engine.kv_pool import PagePool
from ninfer.engine.request import FinishReason, GenerationRequest
from ninfer.engine.sampling import SamplingParams
from ninfer.engine.state_slots import SlotPool

if TYPE_CHECKING:
    from ninfer.engine.media_join import EncodedMedia


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. `token_ids` = prompt + committed output."""

    request_id: str
    request: GenerationRequest
    sampling: SamplingParams
    token_ids: list[int]
    num_prompt: int
    arrival: float
    deadline: float
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0  # tokens whose KV and state are in the cache
    pages: list[int] = field(default_factory=list)
    slot: int | None = None
    cancelled: bool = False
    t_admitted: float | None = None
    t_first_token: float | None = None
    t_last_token: float | None = None
    media: EncodedMedia | None = None  # [vision] tower output, held from first to last chunk

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.num_prompt

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt :]

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < self.num_prompt


@dataclass(frozen=True)
class PrefillUnit:
    seq: Sequence
    start: int
    num_tokens: int
    samples: bool  # the chunk ends the prompt and a first output token is wanted


@dataclass(frozen=True)
class StepPlan:
    prefill: PrefillUnit | None
    decode: tuple[Sequence, ...]

    @property
    def is_empty(self) -> bool:
        return self.prefill is None and not self.decode


@dataclass(frozen=True)
class SchedulerConfig:
    max_concurrency: int = 1
    max_pending: int = 16
    pending_timeout_s: float = 30.0
    prefill_chunk: int = 1024
    max_context: int = 8192
    max_bypass: int = 8


Finish = tuple[Sequence, FinishReason | Exception]


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        pages: PagePool,
        slots: SlotPool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 1 <= config.max_concurrency <= 8:
            raise ValueError("max_concurrency must be in 1..8")
        if slots.num_slots < config.max_concurrency:
            raise ValueError("need at least one state slot per lane")
        self.config = config
        self.pages = pages
        self.slots = slots
        self.clock = clock
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order
        self._bypassed = 0
        self.just_admitted: list[Sequence] = []  # drained by the engine core after schedule()

    # -- intake --------------------------------------------------------------------------------
    def check_fits(self, num_prompt: int, max_tokens: int) -> None:
        need = num_prompt + (1 if max_tokens > 0 else 0)
        if need > self.config.max_context:
            raise ContextLengthExceeded(num_prompt, self.config.max_context)
        capacity = self.pages.num_pages * self.pages.page_size
        if need > capacity:
            raise ContextLengthExceeded(num_prompt, capacity, "kv_capacity")

    def enqueue(self, seq: Sequence) -> None:
        """Queue a request already checked by `check_fits` (the engine counts capacity)."""
        self.waiting.append(seq)

    # -- planning ------------------------------------------------------------------------------
    def schedule(self) -> tuple[StepPlan, list[Finish]]:
        finishes = self._reap()
        self._admit()
        # Decode rows (older requests) reserve first; a row that cannot get its page finishes
        # with reason `context` and frees its pages before the prefill chunk reserves.
        decode, starved = self._plan_decode()
        for seq in starved:
            finishes.append((seq, FinishReason.CONTEXT))
            self.finish(seq)
        prefill = self._plan_prefill()
        return StepPlan(prefill, tuple(decode)), finishes

    def _reap(self) -> list[Finish]:
        """Cancelled requests and waiting requests past their deadline leave now."""
        out: list[Finish] = []
        now = self.clock()
        for seq in list(self.waiting):
            if seq.cancelled:
                out.append((seq, FinishReason.CANCELLED))
                self.finish(seq)
            elif now >= seq.deadline:
                out.append((seq, QueueTimeout("the request was not admitted before its deadline")))
                self.finish(seq)
        for seq in list(self.running):
            if seq.cancelled:
                out.append((seq, FinishReason.CANCELLED))
                self.finish(seq)
        return out

    def _admit(self) -> None:
        while len(self.running) < self.config.max_concurrency and self._admit_one():
            pass

    def _admit_one(self) -> bool:
        """Admit the first waiting request that fits; the head may be passed max_bypass times."""
        for i, seq in enumerate(self.waiting):
            if i > 0 and self._bypassed >= self.config.max_bypass:
                return False  # the head has been passed often enough: it goes next
            first_chunk = min(seq.num_prompt, self.config.prefill_chunk)
            if not self.slots.num_free or self.pages.num_free < self.pages.pages_for(first_chunk):
                continue
            seq.slot = self.slots.allocate()
            seq.status = SeqStatus.RUNNING
            seq.t_admitted = self.clock()
            del self.waiting[i]
            self.running.append(seq)
            self.just_admitted.append(seq)
            self._bypassed = self._bypassed + 1 if i > 0 else 0
            return True
        return False

    def _reserve(self, seq: Sequence, num_tokens: int) -> bool:
        """Make seq's pages cover its first `num_tokens` tokens; False (no change) if impossible."""
        extra = self.pages.pages_for(num_tokens) - len(seq.pages)
        if extra <= 0:
            return True
        got = self.pages.allocate(extra)
        if got is None:
            return False
        seq.pages.extend(got)
        return True

    def _plan_prefill(self) -> PrefillUnit | None:
        for seq in self.running:
            if not seq.is_prefilling:
                continue
            start = seq.num_computed
            n = min(self.config.prefill_chunk, seq.num_prompt - start)
            if not self._reserve(seq, start + n):
                return None  # wait for pages; decodes may finish and free some
            last = start + n == seq.num_prompt
            return PrefillUnit(seq, start, n, samples=last and seq.request.max_tokens > 0)
        return None

    def _plan_decode(self) -> tuple[list[Sequence], list[Sequence]]:
        rows, starved = [], []
        for seq in self.running:
            if seq.is_prefilling:
                continue
            if self._reserve(seq, seq.num_computed + 1):
                rows.append(seq)
            else:
                starved.append(seq)
        return rows, starved

    # -- completion ----------------------------------------------------------------------------
    def finish(self, seq: Sequence) -> None:
        """Remove seq and return every page and its slot (idempotent)."""
        if seq.status == SeqStatus.FINISHED:
            return
        if seq.status == SeqStatus.WAITING:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)
        if seq.pages:
            self.pages.release(seq.pages)
            seq.pages = []
        if seq.slot is not None:
            self.slots.release(seq.slot)
            seq.slot = None
        seq.status = SeqStatus.FINISHED

    def check_integrity(self) -> None:
        self.pages.check_integrity()
        self.slots.check_integrity()
        held = sum(len(s.pages) for s in self.running)
        assert held + self.pages.num_free == self.pages.num_pages, "pages leaked"
        slots = sum(1 for s in self.running if s.slot is not None)
        assert slots + self.slots.num_free == self.slots.num_slots, "slots leaked"
