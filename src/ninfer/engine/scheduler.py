"""The scheduler: admission, resource reservation, step plans and the commit of their outcomes.

No tensors, no model. Each step is `plan = schedule()`, `launched = runner.launch(plan)`, and
later `update(plan, launched.wait())`; with the overlapped loop the next `schedule()` runs while
a step is still in flight, so a sequence has two frontiers: `num_scheduled` (tokens handed to the
device) and `num_computed` (tokens whose step has landed). Only `update()` advances computed and
committed tokens and decides finishes. A step fills a token budget: every decode row first (one
token each, admission order), then prefill chunks of one or more requests (vLLM v1 style). Pages
are reserved before a row is planned: a prompt's pages all at once with its first chunk, a decode
row's one page at a time. Admission is FIFO; when the head cannot fit, up to
`max_bypass` younger requests may pass it, then none until the head is admitted. With a prefix
cache, admission starts a request from the longest checkpoint its prompt extends (shared KV
pages, a copied tail page, a restored StateImage), prefill chunks end at the request's
checkpoint offsets, and a finished conversation leaves its end as a checkpoint; copies travel
in the plan, so every one is ordered behind the step that produced its source. When a unit
cannot get its pages, retained prefixes are reclaimed, then the youngest resident request is
paused (a host snapshot when the budget allows, else a later replay of its committed tokens);
paused requests resume in their original order once their frontier and one more unit fit.
"""

from __future__ import annotations

import enum
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ninfer.engine import snapshots
from ninfer.engine.errors import ContextLengthExceeded, EngineFailed, QueueTimeout
from ninfer.engine.kv_pool import PagePool
from ninfer.engine.output import OutputState
from ninfer.engine.plan import (
    FOLD,
    FROM_DEVICE,
    PAGES,
    ROUND_STOP_IDS,
    CopyOp,
    Row,
    StepOutcome,
    StepPlan,
)
from ninfer.engine.prefix_cache import DISABLED, Checkpoint, PrefixCache, PrefixLookup
from ninfer.engine.recovery import REPLAY, SNAPSHOT, Recovery, Work, split_prefill_row
from ninfer.engine.request import (
    EngineEvent,
    EventKind,
    FinishReason,
    GenerationRequest,
    Timings,
    Usage,
)
from ninfer.engine.sampling import SamplingParams
from ninfer.engine.state_images import StateImages
from ninfer.engine.state_slots import SlotPool
from ninfer.engine.thinking_budget import ThinkingBudget

MAX_CONCURRENCY = 64

if TYPE_CHECKING:
    from ninfer.engine.media_join import EncodedMedia


log = logging.getLogger("ninfer.engine.scheduler")


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PAUSED = "paused"  # admitted, then preempted: no slot, no device pages; its stream stays open
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """One request inside the engine. `token_ids` = prompt + committed output (+ control ids).

    Frontiers: `num_computed` <= `num_scheduled` <= len(token_ids) + 1. Tokens below
    `num_computed` are in the cache; rows up to `num_scheduled` were launched; `sampled_until`
    is one past the furthest position a launched row will sample.
    """

    request_id: str
    request: GenerationRequest
    sampling: SamplingParams
    token_ids: list[int]
    num_prompt: int
    arrival: float
    deadline: float
    output: OutputState | None = None
    budget: ThinkingBudget | None = None
    status: SeqStatus = SeqStatus.WAITING
    num_computed: int = 0
    num_scheduled: int = 0
    sampled_until: int = 0
    pages: list[int] = field(default_factory=list)
    slot: int | None = None
    cancelled: bool = False
    t_admitted: float | None = None
    t_first_token: float | None = None
    t_last_token: float | None = None
    media: EncodedMedia | None = None  # [vision] tower output, held from first to last chunk
    prefix: PrefixLookup | None = None  # the admission's cache decision
    num_cached: int = 0  # prompt tokens taken from the prefix cache
    num_cache_creation: int = 0  # prompt tokens past the hit up to the last explicit marker
    checkpoints: tuple[int, ...] = ()  # prompt offsets to capture while prefilling
    first_row: bool = False  # the next planned row is the first of this residency
    lookup_cache: tuple[int, PrefixLookup] | None = None  # (cache version, lookup) memo
    order: int = -1  # admission ticket: "youngest" and "original order" for pause and resume
    paused_at: int = 0  # PAUSED: the frontier (tokens fed to the device) when it paused
    snapshot: snapshots.Snapshot | None = None  # PAUSED: its host snapshot (None: replay)
    replay_to: int = 0  # rows rebuild the state up to here without sampling (a replay)
    recount: bool = False  # resumed: its first row's plan resets the slot's penalty counts
    num_progress: int = 0  # the highest prompt progress reported (never reported twice)
    recovery: Recovery = field(default_factory=Recovery)  # pause cycles, landed work
    spec: SpecCounts | None = None  # speculative engines: this request's rounds
    spec_inflight: int = 0  # speculative rows launched and not landed (2: one is chained)
    folded_to: int | None = None  # a chained row's device fold reaches here (see _land_spec)
    _prompt_key: tuple | None = None  # memo of the prompt's prefix identity

    def key(self, end: int) -> tuple:
        """The prefix identity of the first `end` tokens, what the prefix cache compares: the
        ids, except that a media prompt's pad tokens are (media identity, row) pairs
        (`MediaPrompt.identity`), so two different images with the same pad count never match
        and a hit implies the same media, grid and MRoPE positions."""
        media = self.request.media
        if media is None:
            return tuple(self.token_ids[:end])
        if self._prompt_key is None:
            self._prompt_key = media.identity
            assert len(self._prompt_key) == self.num_prompt
        if end <= self.num_prompt:
            return self._prompt_key[:end]
        return self._prompt_key + tuple(self.token_ids[self.num_prompt : end])

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.num_prompt

    @property
    def output_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt :]

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed < self.num_prompt

    @property
    def num_inflight(self) -> int:
        return self.num_scheduled - self.num_computed

    @property
    def prefill_to(self) -> int:
        """Rows up to here are chunked prefill rows (the prompt, or a replay beyond it)."""
        return max(self.num_prompt, self.replay_to)


@dataclass
class SpecCounts:
    """One request's speculative work (request_done.speculative). A round commits accepted + 1
    tokens; a fallback step is a plain decode step of a speculative engine; the first token
    after prefill is neither."""

    draft_window: int
    rounds: int = 0
    drafted_tokens: int = 0  # every drafted token of every round, the last one's included
    accepted_tokens: int = 0  # drafts equal to the target's choice
    fallback_steps: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def on_round(self, num_drafts: int, num_accepted: int) -> None:
        self.rounds += 1
        self.drafted_tokens += num_drafts
        self.accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_drafts:
            self.accepted_per_position += [0] * (num_drafts - len(self.accepted_per_position))
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1


@dataclass(frozen=True)
class SchedulerConfig:
    max_concurrency: int = 1
    max_pending: int = 16
    pending_timeout_s: float = 30.0
    prefill_chunk: int = 1024
    max_context: int = 8192
    max_bypass: int = 8
    max_batched_tokens: int | None = None  # per-step token budget; None: chunk + concurrency
    draft_tokens: int = 0  # speculative decoding with the MTP head: k drafts per round (0: off)

    @property
    def token_budget(self) -> int:
        if self.max_batched_tokens is not None:
            return self.max_batched_tokens
        return self.prefill_chunk + self.max_concurrency


Event = tuple[Sequence, EngineEvent]


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        pages: PagePool,
        slots: SlotPool,
        clock: Callable[[], float] = time.monotonic,
        *,
        images: StateImages | None = None,
        cache: PrefixCache | None = None,
    ) -> None:
        if not 1 <= config.max_concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"max_concurrency must be in 1..{MAX_CONCURRENCY}")
        if slots.num_slots < config.max_concurrency:
            raise ValueError("need at least one state slot per lane")
        if config.token_budget < config.max_concurrency + 1:
            raise ValueError(
                f"max_batched_tokens {config.token_budget} must exceed max_concurrency "
                f"{config.max_concurrency}: a step holds every decode row plus prefill"
            )
        if cache is not None and (images is None or cache.images is not images):
            raise ValueError("a prefix cache needs the scheduler's StateImages")
        self.config = config
        self.pages = pages
        self.slots = slots
        self.images = images
        self.cache = cache
        self.clock = clock
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order (`order`)
        self.paused: list[Sequence] = []  # admission order
        self._tickets = itertools.count()
        self._planned: set[int] = set()  # ids of sequences with a row in the plan being built
        self._bypassed = 0
        # penalty-count corrections for the next plan (see StepPlan)
        self._uncount: list[int] = []
        self._count: list[tuple[int, int]] = []
        # copies for the next plan (before its forwards) and host blocks it releases
        self._copies: list[CopyOp] = []
        self._free_host: list[int] = []
        self._recount: list[tuple[int, tuple[int, ...]]] = []
        # counters (plain ints: the observability layer publishes them)
        self.num_prefix_hits = 0
        self.num_prefix_hit_tokens = 0
        self.num_tail_copies = 0
        self.num_preemptions = 0
        self.num_snapshot_restores = 0
        self.num_replay_restores = 0
        self.work = Work()  # landed prefill / decode / replay tokens, engine-wide
        self._pending: list[Event] = []  # SCHEDULING events decided inside planning helpers
        self.num_spec_rewinds = 0  # rounds cut short of their accepted length by a commit
        # a request waited for pages this schedule: rounds stop chaining, so the sequences in
        # flight land and can be paused for it (a chained sequence is never a pause victim)
        self._short_of_pages = False

    @property
    def num_replayed_tokens(self) -> int:
        return self.work.replay

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

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.paused)

    # -- planning ------------------------------------------------------------------------------
    def schedule(self) -> tuple[StepPlan, list[Event]]:
        """Plan one step; also returns the events decided while planning (admissions, reaped
        and starved requests). Rows of a step still in flight are accounted for."""
        self._planned = set()
        self._short_of_pages = False
        events = self._reap()
        events += self._admit()
        budget = self.config.token_budget
        decode, starved = self._plan_decode(budget)
        for seq in starved:
            events += self._finish(seq, FinishReason.CONTEXT)
        prefill = self._plan_prefill(budget - sum(r.num_new_tokens for r in decode))
        events += self._take_pending()
        plan = StepPlan(
            decode,
            prefill,
            tuple(self._uncount),
            tuple(self._count),
            tuple(self._copies),
            tuple(self._free_host),
            tuple(self._recount),
        )
        if not plan.is_empty:
            self._uncount, self._count = [], []
            self._copies, self._free_host, self._recount = [], [], []
        return plan, events

    def _reap(self) -> list[Event]:
        """Cancelled requests and waiting requests past their deadline leave now."""
        out: list[Event] = []
        now = self.clock()
        for seq in list(self.waiting):
            if seq.cancelled:
                out += self._finish(seq, FinishReason.CANCELLED)
            elif now >= seq.deadline:
                error = QueueTimeout("the request was not admitted before its deadline")
                out += self._finish(seq, error)
        for seq in list(self.running) + list(self.paused):
            if seq.cancelled:
                out += self._finish(seq, FinishReason.CANCELLED)
        return out

    def _admit(self) -> list[Event]:
        out: list[Event] = []
        # paused requests first, in their original order (a younger one never overtakes)
        while self.paused and len(self.running) < self.config.max_concurrency:
            seq = self.paused[0]
            if self.pages.pages_for(self._resume_tokens(seq)) > self.pages.num_pages:
                out += self._finish(seq, FinishReason.CONTEXT)  # its next token cannot fit
                continue
            if not self._resume(seq):
                break
        while len(self.running) < self.config.max_concurrency:
            seq = self._admit_one()
            if seq is None:
                break
            assert seq.prefix is not None
            admitted = EngineEvent(
                seq.request_id,
                EventKind.ADMITTED,
                num_prompt=seq.num_prompt,
                num_cached=seq.num_cached,
                prefix_cache=seq.prefix.header(),
                num_cache_creation=seq.num_cache_creation,
            )
            out.append((seq, admitted))
        return out

    def _admit_one(self) -> Sequence | None:
        """Admit the first waiting request that fits; the head may be passed max_bypass times."""
        for i, seq in enumerate(self.waiting):
            if i > 0 and self._bypassed >= self.config.max_bypass:
                return None  # the head has been passed often enough: it goes next
            if not self.slots.num_free:
                return None
            if not self._start(seq):
                continue
            seq.status = SeqStatus.RUNNING
            seq.t_admitted = self.clock()
            seq.order = next(self._tickets)
            del self.waiting[i]
            self.running.append(seq)
            self._bypassed = self._bypassed + 1 if i > 0 else 0
            return seq
        return None

    def _lookup(self, seq: Sequence) -> PrefixLookup:
        if self.cache is None:
            return DISABLED
        memo = seq.lookup_cache
        if memo is not None and memo[0] == self.cache.version:
            return memo[1]
        found = self.cache.lookup(seq.key(seq.num_prompt))
        seq.lookup_cache = (self.cache.version, found)
        return found

    def _start(self, seq: Sequence) -> bool:
        """Take seq's slot and its prompt's share of pages (checked, the rest reserved with the
        first chunk), starting from the longest cached prefix; False (no change) if short."""
        found = self._take_hit_or_cold(seq, self._lookup(seq), seq.num_prompt)
        if found is None:
            return False
        seq.prefix = found
        seq.first_row = True
        seq.lookup_cache = None
        if found.checkpoint is not None:
            seq.num_cached = found.checkpoint.length
            self.num_prefix_hits += 1
            self.num_prefix_hit_tokens += seq.num_cached
        if self.cache is not None:
            offsets = {int(t) for t in seq.request.cache_checkpoints}
            wanted = (t for t in offsets if seq.num_cached < t < seq.num_prompt)
            seq.checkpoints = tuple(sorted(wanted))
            marked = min(seq.request.cache_marked, seq.num_prompt)
            seq.num_cache_creation = max(0, marked - seq.num_cached)
        return True

    def _take_hit_or_cold(
        self, seq: Sequence, found: PrefixLookup, num_tokens: int
    ) -> PrefixLookup | None:
        """`_take` from the hit `found`, else from nothing when the hit cannot fit and nothing
        running will free a page: the hit's checkpoint keeps its partial last page while seq
        writes a copy of it, one page beyond seq's own (seq ends in the pool's last page), so
        waiting would be forever; the checkpoint may be reclaimed then. The lookup used, or
        None (no change) when seq must wait."""
        if self._take(seq, found, num_tokens):
            return found
        if found.checkpoint is None or self.running:
            return None  # a running request frees pages when it ends: wait for it
        cold = PrefixLookup(None, "capacity")
        return cold if self._take(seq, cold, num_tokens) else None

    def _take(self, seq: Sequence, found: PrefixLookup, num_tokens: int) -> bool:
        """A lane slot, and free pages for `num_tokens` tokens beyond those shared with the
        checkpoint `found` names (whose restore copies then enter the plan); False, with no
        change, when they are not there even after reclaiming other checkpoints."""
        ck = found.checkpoint
        size = self.pages.page_size
        shared = ck.pages[: ck.length // size] if ck is not None else []
        self.pages.retain(shared)  # pinned: reclaiming below must not free them
        need = self.pages.pages_for(num_tokens) - len(shared)
        if not self.slots.num_free or not self._free_pages(need, keep=ck):
            self.pages.release(shared)
            return False
        slot = self.slots.allocate()
        assert slot is not None
        seq.slot = slot
        seq.pages = list(shared)
        seq.num_computed = seq.num_scheduled = 0
        if ck is not None:
            assert self.cache is not None and self.images is not None
            if ck.length % size:  # the prefix ends inside a page: the writer gets a copy
                tail = self.pages.allocate(1)
                assert tail is not None
                self._copies.append(CopyOp(PAGES, (ck.pages[len(shared)],), tuple(tail)))
                seq.pages += tail
                self.num_tail_copies += 1
            if not ck.image.on_device:  # a request-owned host-to-device transfer
                seq.recovery.add_transfer("state", "to_device", self.images.image_bytes)
            self.images.restore(ck.image, slot, self._copies)
            self.cache.use(ck)
            seq.num_computed = seq.num_scheduled = ck.length
        return True

    def _free_pages(self, need: int, keep: Checkpoint | None = None) -> bool:
        """At least `need` free pages, reclaiming retained prefixes (LRU, never `keep`)."""
        if self.pages.num_free >= need:
            return True
        return self.cache is not None and self.cache.reclaim(need, self._free_host, keep=keep)

    def _reserve(self, seq: Sequence, num_tokens: int) -> bool:
        """Make seq's pages cover its first `num_tokens` tokens; False (no change) if impossible."""
        extra = self.pages.pages_for(num_tokens) - len(seq.pages)
        if extra <= 0:
            return True
        if not self._free_pages(extra):
            return False
        got = self.pages.allocate(extra)
        assert got is not None
        seq.pages.extend(got)
        return True

    def _decode_position(self, seq: Sequence) -> int | None:
        """The position seq's next decode row feeds, or None when it has none to run now."""
        if seq.num_scheduled < seq.prefill_to:
            return None
        q = seq.num_scheduled
        if q < len(seq.token_ids):
            return q  # a known token (the last committed one, or an inserted control token)
        if q >= seq.sampled_until:
            return None  # nothing in flight will produce it
        # The step in flight samples position q. If committing it must end the request (token
        # or context limit), a row feeding it would only be discarded.
        if q + 1 - seq.num_prompt >= seq.request.max_tokens or q + 1 >= self.config.max_context:
            return None
        return q

    def _plan_decode(self, budget: int) -> tuple[tuple[Row, ...], list[Sequence]]:
        if self.config.draft_tokens:
            return self._plan_spec(budget)
        rows: list[Row] = []
        starved: list[Sequence] = []
        for seq in list(self.running):
            if seq.status != SeqStatus.RUNNING:
                continue  # paused for an older request earlier in this loop
            q = self._decode_position(seq)
            if q is None or len(rows) >= budget:
                continue
            if not self._reserve_or_pause(seq, q + 1):
                alone = len(self.running) == 1 and seq.status == SeqStatus.RUNNING
                if alone and seq.num_inflight == 0:
                    starved.append(seq)  # alone and out of pages: reason `context`
                continue  # its step in flight lands first; the next plan decides
            known = q < len(seq.token_ids)
            assert seq.slot is not None
            rows.append(
                Row(
                    seq,
                    start=q,
                    token_ids=(seq.token_ids[q] if known else FROM_DEVICE,),
                    pages=tuple(seq.pages),
                    slot=seq.slot,
                    samples=True,
                    sample_index=q + 1 - seq.num_prompt,
                    # the next token is already known (a control token): the sample is discarded
                    count_sample=q + 1 >= len(seq.token_ids),
                    first=self._first_row(seq),
                )
            )
            seq.num_scheduled = q + 1
            seq.sampled_until = max(seq.sampled_until, q + 2)
            self._planned.add(id(seq))
        return tuple(rows), starved

    def _plan_spec(self, budget: int) -> tuple[tuple[Row, ...], list[Sequence]]:
        """Decode rows of a speculative engine. A sequence gets a row only once its previous
        step has landed (how many tokens a round keeps is known only then). A round feeds t0
        and k drafts when t0 is its only unfed token, its context has room for the round and
        the head's drafts after it (L + 2k + 1 <= max_context, pages for that many tokens
        without pausing anyone) and the budget holds k + 1 tokens; otherwise a fallback step
        feeds one token (reserving, or pausing for, just its page)."""
        k = self.config.draft_tokens
        rows: list[Row] = []
        starved: list[Sequence] = []
        for seq in list(self.running):
            if seq.status != SeqStatus.RUNNING or seq.num_scheduled < seq.prefill_to:
                continue
            if seq.num_inflight or seq.sampled_until > len(seq.token_ids):
                if budget >= k + 1 and self._chain(seq):
                    rows.append(self._chained_row(seq))
                    budget -= k + 1
                continue  # otherwise its last step lands first
            q = seq.num_scheduled
            if q >= len(seq.token_ids) or budget < 1:
                continue
            last = q == len(seq.token_ids) - 1
            drafts = 0
            if last and q + 2 * k + 1 <= self.config.max_context and budget >= k + 1:
                drafts = k if self._reserve(seq, q + 2 * k + 1) else 0
            if not drafts and not self._reserve_or_pause(seq, q + 1):
                alone = len(self.running) == 1 and seq.status == SeqStatus.RUNNING
                if alone and seq.num_inflight == 0:
                    starved.append(seq)
                continue
            assert seq.slot is not None
            rows.append(
                Row(
                    seq,
                    start=q,
                    token_ids=(seq.token_ids[q],) + (FROM_DEVICE,) * drafts,
                    pages=tuple(seq.pages),
                    slot=seq.slot,
                    samples=True,
                    sample_index=q + 1 - seq.num_prompt,
                    logits="all" if drafts else "last",
                    count_sample=last,
                    first=self._first_row(seq),
                    spec=True,
                    num_drafts=drafts,
                )
            )
            budget -= 1 + drafts
            seq.num_scheduled = q + 1 + drafts
            seq.sampled_until = q + 2 + drafts
            seq.spec_inflight += 1
            self._planned.add(id(seq))
        return tuple(rows), starved

    def chainable(self, seq: Sequence) -> bool:
        """Whether seq's next round may be planned before its round in flight lands (a
        *chained* row: t0, its position and the previous round's fold read on the device).

        Only where nothing the host decides at a landing could change what the device already
        assumed (the RNG's output index and the penalty counts come from the device too): one
        round of k drafts in flight, no thinking budget that the round in flight could reach
        (a control token cuts a round without ending it), no stop strings unless there is no
        prefix cache (a stop string found inside the round leaves the fold past the end of the
        conversation, which only a kept conversation would read), at most ROUND_STOP_IDS stop
        ids (the round finds those on the device and ends its fold at the first, as the host's
        commit does), the round in flight unable to reach max_tokens,
        room for the next round and its drafts in the context, and no paused request nor one
        left short of pages by this schedule (a sequence with a round always in flight is never
        paused; pauses must stay possible). Waiting requests do not stop it: they wait for a
        lane or pages, which a finish frees, and admission never pauses anyone."""
        k = self.config.draft_tokens
        return (
            k > 0
            and seq.status == SeqStatus.RUNNING
            and not seq.cancelled
            and seq.spec_inflight == 1
            and seq.num_inflight == k + 1  # a round in flight (a fallback step feeds one token)
            and _budget_quiet(seq, k)
            and (not seq.request.stop or self.cache is None)
            and seq.output is not None
            and len(seq.output.stop_token_ids) <= ROUND_STOP_IDS
            and not self.paused
            and not self._short_of_pages
            and seq.num_output + k + 1 < seq.request.max_tokens
            and seq.num_scheduled + 2 * k + 1 <= self.config.max_context
        )

    def _chain(self, seq: Sequence) -> bool:
        """`chainable`, and the pages for the next round's furthest reach (no pausing)."""
        k = self.config.draft_tokens
        return self.chainable(seq) and self._reserve(seq, seq.num_scheduled + 2 * k + 1)

    def _chained_row(self, seq: Sequence) -> Row:
        """The round after the one in flight. Its start is at most the in-flight round's start
        + k + 1 (= num_scheduled, the bound the row carries); the landing of the round in
        flight fixes the frontiers (`_land_spec`)."""
        k = self.config.draft_tokens
        bound = seq.num_scheduled
        assert seq.slot is not None
        seq.spec_inflight += 1
        self._planned.add(id(seq))
        return Row(
            seq,
            start=bound,
            token_ids=(FROM_DEVICE,) * (1 + k),
            pages=tuple(seq.pages),
            slot=seq.slot,
            samples=True,
            sample_index=bound + 1 - seq.num_prompt,
            logits="all",
            spec=True,
            num_drafts=k,
            chained=True,
        )

    def may_plan_ahead(self, plan: StepPlan) -> bool:
        """Whether the engine may plan the next step before `plan` lands. Always for plain
        decoding (the overlapped loop); for a speculative engine only when every row of `plan`
        is a round whose sequence can chain its next one: otherwise the sequences in flight
        would sit out the next step, splitting the batch into two alternating halves."""
        if not self.config.draft_tokens:
            return True
        return not plan.prefill and all(
            r.spec and r.num_drafts and self.chainable(r.seq) for r in plan.decode
        )

    def _plan_prefill(self, budget: int) -> tuple[Row, ...]:
        rows: list[Row] = []
        for seq in list(self.running):
            if budget <= 0:
                break
            start, target = seq.num_scheduled, seq.prefill_to
            if seq.status != SeqStatus.RUNNING or start >= target:
                continue
            n = min(self.config.prefill_chunk, target - start, budget)
            # a chunk ends exactly at the next checkpoint: its state is captured right after
            n = min([n] + [t - start for t in seq.checkpoints if t > start])
            # NOTE: the whole prompt's pages (a replay's: up to its frontier) are reserved with
            # its first chunk: two half-reserved prompts could otherwise wait on each other
            # forever.
            if not self._reserve_or_pause(seq, target):
                if seq.status != SeqStatus.RUNNING:
                    continue  # it paused itself for older requests
                break  # wait for pages (FIFO): decodes may finish and free some
            end = start + n
            # the prompt's last chunk samples, unless the output already began (a replay)
            samples = (
                end == seq.num_prompt
                and seq.request.max_tokens > 0
                and len(seq.token_ids) == seq.num_prompt
            )
            after: list[CopyOp] = []
            if end in seq.checkpoints:
                self._checkpoint(seq, end, after)
            assert seq.slot is not None
            rows.append(
                Row(
                    seq,
                    start=start,
                    token_ids=tuple(seq.token_ids[start:end]),
                    pages=tuple(seq.pages),
                    slot=seq.slot,
                    samples=samples,
                    sample_index=0,
                    logits="last" if samples else "none",
                    checkpoint_at=(n,) if after else (),
                    after=tuple(after),
                    first=self._first_row(seq),
                )
            )
            self._planned.add(id(seq))
            seq.num_scheduled = end
            if samples:
                seq.sampled_until = end + 1
            budget -= n
        return tuple(rows)

    def _first_row(self, seq: Sequence) -> bool:
        """Whether the row being planned is seq's first of this residency (and, after a pause,
        queue the count rebuild that must follow the runner's reset in the same plan)."""
        first, seq.first_row = seq.first_row, False
        if first and seq.recount:
            assert seq.slot is not None
            self._recount.append((seq.slot, tuple(seq.output_ids)))
            seq.recount = False
        return first

    # -- pause and resume ----------------------------------------------------------------------
    def _reserve_or_pause(self, seq: Sequence, num_tokens: int) -> bool:
        """Pages for seq's next unit: reclaim retained prefixes, then pause the youngest
        resident request (seq itself when it is the youngest) until they fit. False when seq
        must wait (no younger request can give way now) or paused itself."""
        while not self._reserve(seq, num_tokens):
            victim = self._victim(seq)
            if victim is None:
                self._short_of_pages = True  # no chaining until a schedule finds room again
                return False
            self._pause(victim)
            if victim is seq:
                return False
        return True

    def _victim(self, seq: Sequence) -> Sequence | None:
        """The youngest request younger than seq without a row in this plan; else seq itself
        when it is the youngest of several residents; else None."""
        # (a speculative round in flight is never paused: how many of its tokens it keeps is
        # only known when it lands, one loop later)
        younger = [
            s
            for s in self.running
            if s.order > seq.order
            and id(s) not in self._planned
            and not (self.config.draft_tokens and s.num_inflight)
        ]
        if younger:
            return max(younger, key=lambda s: s.order)
        if len(self.running) > 1 and seq is max(self.running, key=lambda s: s.order):
            return seq if id(seq) not in self._planned else None
        return None

    def _pause(self, seq: Sequence) -> None:
        """Free seq's slot and pages. Its state as of every launched row (copies are ordered
        behind them) goes to a host snapshot when the budget holds it, else it is replayed on
        resume; a sample still in flight is committed when its step lands."""
        assert seq.slot is not None and seq.status == SeqStatus.RUNNING
        frontier = seq.num_scheduled
        seq.snapshot = None
        if self.images is not None and frontier > 0:
            kept = seq.pages[: self.pages.pages_for(frontier)]
            if self.cache is not None:  # live requests come before retained host images
                need = self.images.image_bytes + len(kept) * self.images.page_bytes
                self.cache.host_room(need, self._free_host)
            seq.snapshot = snapshots.take(self.images, seq.slot, kept, frontier, self._copies)
        rec = seq.recovery
        rec.preemptions += 1
        rec.route = None
        rec.t_paused = self.clock()
        rec.replaying = rec.recovering = False
        self._transition(seq, "pause_started")
        rec.route = SNAPSHOT if seq.snapshot is not None else REPLAY
        if seq.snapshot is not None:
            assert self.images is not None
            rec.add_transfer("state", "to_host", self.images.image_bytes)
            rec.add_transfer("main_kv", "to_host", len(kept) * self.images.page_bytes)
        self.pages.release(seq.pages)
        seq.pages = []
        self.slots.release(seq.slot)
        seq.slot = None
        seq.paused_at = frontier
        seq.status = SeqStatus.PAUSED
        self.running.remove(seq)
        self.paused.append(seq)
        self.paused.sort(key=lambda s: s.order)
        self.num_preemptions += 1
        self._transition(seq, "paused")

    @staticmethod
    def _resume_tokens(seq: Sequence) -> int:
        """Tokens a resumed request must hold pages for: its frontier (or its whole prompt, or
        its replay) and the next token it computes."""
        frontier = max(seq.paused_at, seq.num_prompt, seq.replay_to)
        return frontier + (1 if seq.request.max_tokens > 0 else 0)

    def _resume(self, seq: Sequence) -> bool:
        """Back into a lane: the snapshot restored, or a replay from the longest checkpoint of
        its own tokens (no sampling, nothing re-emitted). Needs room for its frontier and one
        more token; waits while a sample of its is still in flight."""
        frontier = seq.paused_at
        if seq.num_computed < frontier or seq.sampled_until > len(seq.token_ids):
            return False  # its last step has not landed yet
        rec = seq.recovery
        if seq.snapshot is not None:
            assert self.images is not None
            if not self._take(seq, DISABLED, self._resume_tokens(seq)):
                return False
            assert seq.slot is not None
            self._transition(seq, "restore_started")
            got = self.pages.allocate(self.pages.pages_for(self._resume_tokens(seq)))
            assert got is not None and len(got) >= seq.snapshot.num_pages
            seq.pages += got
            kv_bytes = seq.snapshot.num_pages * self.images.page_bytes
            rec.add_transfer("state", "to_device", self.images.image_bytes)
            rec.add_transfer("main_kv", "to_device", kv_bytes)
            snapshots.restore(
                self.images, seq.snapshot, seq.slot, seq.pages, self._copies, self._free_host
            )
            seq.snapshot = None
            seq.num_computed = seq.num_scheduled = frontier
            rec.snapshot_restores += 1
            self.num_snapshot_restores += 1
        else:
            found = DISABLED
            if self.cache is not None:
                found = self.cache.lookup(seq.key(frontier), whole=True)
            if self._take_hit_or_cold(seq, found, self._resume_tokens(seq)) is None:
                return False
            self._transition(seq, "restore_started")
            seq.replay_to = max(seq.replay_to, frontier)  # a pause inside a replay keeps its end
            if frontier > 0:  # (paused before anything ran: simply started again)
                rec.replay_restores += 1
                self.num_replay_restores += 1
                rec.replaying = seq.num_computed < seq.replay_to
        rec.end_pause(self.clock())
        rec.recovering = True
        self._transition(seq, "restored")
        if rec.route == REPLAY and not rec.replaying:
            self._transition(seq, "replay_complete")  # its own checkpoint held the frontier
        seq.first_row = seq.recount = True  # counts rebuilt; a replay from 0 zeroes the state
        seq.status = SeqStatus.RUNNING
        self.paused.remove(seq)
        self.running.append(seq)
        self.running.sort(key=lambda s: s.order)
        return True

    def _checkpoint(self, seq: Sequence, end: int, capture: list[CopyOp]) -> None:
        """Retain seq's first `end` tokens (computed, or launched before `capture` runs)."""
        assert self.cache is not None and seq.slot is not None
        pages = seq.pages[: self.pages.pages_for(end)]
        self.cache.publish(seq.key(end), pages, seq.slot, capture, self._copies, self._free_host)

    # -- commit --------------------------------------------------------------------------------
    def update(self, plan: StepPlan, outcome: StepOutcome) -> list[Event]:
        """Commit a landed step: advance frontiers, commit kept samples, decide finishes."""
        now = self.clock()
        events: list[Event] = []
        mark = len(self._copies)  # folds go before any copy this commit queues (captures)
        folds: list[tuple[int, int]] = []
        for i, (row, token) in enumerate(zip(plan.rows, outcome.sampled, strict=True)):
            seq = row.seq
            if seq.status == SeqStatus.FINISHED:
                continue  # finished while this step was in flight: nothing of it is kept
            # (a request paused after this step launched still commits what it sampled)
            if row.spec:
                committed, accepted = outcome.committed[i], outcome.accepted[i]
                assert committed is not None
                events += self._land_spec(seq, row, committed, accepted, now, folds)
                continue
            end = row.start + row.num_new_tokens
            seq.num_computed = max(seq.num_computed, end)
            self._landed_prefill(seq, row.start, end)
            if row.start < seq.num_prompt and min(end, seq.num_prompt) > seq.num_progress:
                seq.num_progress = min(end, seq.num_prompt)  # a replay reports nothing again
                events.append(
                    (
                        seq,
                        EngineEvent(
                            seq.request_id,
                            EventKind.PROGRESS,
                            num_processed=seq.num_progress,
                            num_prompt=seq.num_prompt,
                        ),
                    )
                )
                if end == seq.num_prompt and seq.request.max_tokens == 0:
                    seq.t_first_token = now
                    events += self._finish(seq, FinishReason.LENGTH)
                    continue
            if not row.samples or end != len(seq.token_ids):
                continue  # no sample, or its position already holds a known (control) token
            assert token is not None
            events += self._commit_token(seq, token, now)
        if folds:
            slots, nums = zip(*folds, strict=True)
            self._copies.insert(mark, CopyOp(FOLD, tuple(nums), tuple(slots)))
        return events + self._take_pending()

    def _landed_prefill(self, seq: Sequence, start: int, end: int) -> None:
        """Count a landed prefill or replay row and close the recovery boundaries it crosses."""
        if start >= seq.prefill_to:
            return  # a decode row: its token is counted when committed
        fresh, replay = split_prefill_row(start, end, seq.num_prompt, seq.replay_to)
        rec = seq.recovery
        rec.work.prefill += fresh
        rec.work.replay += replay
        self.work.prefill += fresh
        self.work.replay += replay
        if rec.replaying and seq.num_computed >= seq.replay_to:
            rec.replaying = False
            self._transition(seq, "replay_complete")
        if rec.recovering and fresh and seq.status != SeqStatus.PAUSED:
            self._recovered(seq)

    def _recovered(self, seq: Sequence) -> None:
        """The first fresh unit after a resume landed: the pause cycle is over."""
        seq.recovery.recovering = False
        self._transition(seq, "recovery_complete")

    def _transition(self, seq: Sequence, name: str) -> None:
        """Queue a SCHEDULING event for seq (requests that asked for them only)."""
        if not seq.request.scheduling_events:
            return
        boundary = seq.recovery.transition(name, self.clock(), seq.arrival, self.work)
        event = EngineEvent(seq.request_id, EventKind.SCHEDULING, scheduling=boundary)
        self._pending.append((seq, event))

    def _take_pending(self) -> list[Event]:
        out, self._pending = self._pending, []
        return out

    def _land_spec(
        self,
        seq: Sequence,
        row: Row,
        committed: tuple[int, ...],
        accepted: int,
        now: float,
        folds: list[tuple[int, int]],
    ) -> list[Event]:
        """Commit a round (or fallback step) token by token, as plain decoding would: a stop,
        the token limit or a cancel ends it early, a control token inserted after one replaces
        the rest. The fed frontier follows the committed tokens (a kept draft was fed; the
        target's own last token was not); a round's slot then folds exactly that many verify
        columns into its state (appended to `folds` as (slot, columns); `update` queues one
        FOLD copy ahead of any capture the commit queued)."""
        # a chained row starts where the round before it ended (that round landed first)
        q = seq.num_computed if row.chained else row.start
        successor = seq.spec_inflight > 1  # a chained row is in flight behind this one
        seq.spec_inflight -= 1
        if seq.spec is not None:
            if row.num_drafts:
                seq.spec.on_round(row.num_drafts, accepted)
            else:
                seq.spec.fallback_steps += 1
        seq.sampled_until = len(seq.token_ids)
        seq.num_computed = seq.num_scheduled = q + 1 + accepted
        if q + 1 != len(seq.token_ids):
            return []  # it fed a known control token: its sample is not the next token
        slot = seq.slot
        events: list[Event] = []
        kept = 0
        # the chained row folds this round's columns on the device up to its first stop id,
        # what the commit keeps unless a cancel ends it (`SpecStep._leave_feed`); a conversation
        # whose state would be ahead of its tokens is not kept
        seq.folded_to = q + 1 + _fold_columns(seq, committed, accepted) if successor else None
        for n, token in enumerate(committed, start=1):
            # the frontier as if committed one at a time (checkpoints at a stop see it)
            seq.num_computed = seq.num_scheduled = q + 1 + min(n, accepted)
            if seq.slot is not None and not successor:  # (else the successor counts it)
                self._count.append((seq.slot, token))
            events += self._commit_token(seq, token, now)
            kept = min(n, accepted)
            if seq.status == SeqStatus.FINISHED or len(seq.token_ids) != q + 1 + n:
                break  # finished, or control tokens follow this one
        seq.folded_to = None
        if row.num_drafts and slot is not None and not successor:
            folds.append((slot, 1 + kept))
        if kept < accepted:
            self.num_spec_rewinds += 1
        if successor and seq.status != SeqStatus.FINISHED and kept < accepted:
            # `chainable` rules this out (only a finish may cut a round with a successor); were
            # it to happen, the slot is folded past the tokens and the successor starts at the
            # wrong token: this request ends with an error, and no other request is touched
            log.error("request %s: a chained round's predecessor was cut", seq.request_id)
            error = EngineFailed("internal error: a speculative round was cut under its successor")
            return events + self._finish(seq, error)
        if successor and seq.status != SeqStatus.FINISHED:
            start = q + 1 + accepted  # the chained row's t0 is the token just committed
            seq.num_scheduled = start + 1 + row.num_drafts
            seq.sampled_until = start + 2 + row.num_drafts
        return events

    def _commit_token(self, seq: Sequence, token_id: int, now: float) -> list[Event]:
        if seq.cancelled:  # two-phase commit: a cancelled row commits nothing
            return self._finish(seq, FinishReason.CANCELLED)
        assert seq.output is not None
        seq.token_ids.append(token_id)
        if seq.t_first_token is None:
            seq.t_first_token = now
        self._landed_output(seq, 1 if seq.num_output > 1 else 0)
        seq.t_last_token = now
        commit = seq.output.commit(token_id, seq.num_output, len(seq.token_ids))
        events: list[Event] = [
            (
                seq,
                EngineEvent(
                    seq.request_id,
                    EventKind.TOKENS,
                    [token_id],
                    commit.text,
                    num_prompt=seq.num_prompt,
                    num_output=seq.num_output,
                    timings=timings_of(seq),
                ),
            )
        ]
        if commit.finish is not None:
            return events + self._finish(seq, commit.finish, flush=False)
        if seq.budget is not None:
            events += self._insert_control(seq, seq.budget.after_commit(token_id, seq.num_output))
        return events

    def _insert_control(self, seq: Sequence, control_ids: tuple[int, ...]) -> list[Event]:
        """Commit control tokens without sampling. They join `token_ids` uncomputed; decode rows
        feed them one per step (their samples discarded) before sampling again."""
        if not control_ids:
            return []
        assert seq.output is not None
        position = len(seq.token_ids)
        seq.token_ids.extend(control_ids)
        self._landed_output(seq, len(control_ids))
        # (a paused request has no slot: its counts are rebuilt from its output on resume)
        if seq.sampled_until > position:  # a row in flight samples `position`: discarded now
            if seq.slot is not None:
                self._uncount.append(seq.slot)
            seq.sampled_until = position
        if seq.slot is not None:
            self._count.extend((seq.slot, t) for t in control_ids)
        text = seq.output.commit_control(control_ids)
        return [
            (
                seq,
                EngineEvent(
                    seq.request_id,
                    EventKind.TOKENS,
                    list(control_ids),
                    text,
                    num_prompt=seq.num_prompt,
                    num_output=seq.num_output,
                    num_control=len(control_ids),
                    timings=timings_of(seq),
                ),
            )
        ]

    def _landed_output(self, seq: Sequence, num_decode: int) -> None:
        """Committed output: decode / control work (not the first token, which is prefill's),
        and the first fresh unit after a resume."""
        seq.recovery.work.decode += num_decode
        self.work.decode += num_decode
        if seq.recovery.recovering:
            self._recovered(seq)

    # -- completion ----------------------------------------------------------------------------
    def _finish(
        self, seq: Sequence, why: FinishReason | BaseException, *, flush: bool = True
    ) -> list[Event]:
        """Release seq and return its terminal event (none if it had already finished)."""
        if seq.status == SeqStatus.FINISHED:
            return []
        if isinstance(why, FinishReason) and why != FinishReason.CANCELLED:
            self._keep_conversation(seq)
        self.finish(seq)
        rec = seq.recovery
        if rec.preemptions:
            self._transition(seq, "terminal")
        out = self._take_pending()  # seq's own boundaries must precede its terminal event
        if isinstance(why, BaseException):
            return out + [(seq, EngineEvent(seq.request_id, EventKind.ERROR, error=why))]  # type: ignore[arg-type]
        text = seq.output.finish() if (flush and seq.output is not None) else ""
        event = EngineEvent(
            seq.request_id,
            EventKind.FINISHED,
            text=text,
            finish_reason=why,
            usage=Usage(
                seq.num_prompt,
                seq.num_output,
                seq.num_cached,
                seq.num_cache_creation,
            ),
            timings=timings_of(seq),
            stop_string=seq.output.stop_string if seq.output is not None else None,
            num_cached=seq.num_cached,
            prefix_cache=seq.prefix.header() if seq.prefix is not None else None,
            num_preemptions=rec.preemptions,
            num_snapshot_restores=rec.snapshot_restores,
            num_replay_restores=rec.replay_restores,
            num_replayed_tokens=rec.replayed_tokens,
        )
        return out + [(seq, event)]

    def _keep_conversation(self, seq: Sequence) -> None:
        """The end of a finished conversation becomes a checkpoint: every token fed to the
        device (a row still in flight may feed the last committed one)."""
        if self.cache is None or seq.status != SeqStatus.RUNNING or seq.slot is None:
            return
        end = seq.num_scheduled
        if end <= seq.num_cached or end > len(seq.token_ids):
            return  # nothing new, or the device was fed a token that was not committed
        if seq.folded_to is not None and seq.folded_to != end:
            return  # a chained round folds past the end on the device (`_land_spec`)
        self._checkpoint(seq, end, self._copies)

    def fail(self, seq: Sequence, error: BaseException) -> list[Event]:
        """End one request with an error (engine-wide failure or shutdown)."""
        return self._finish(seq, error)

    def finish(self, seq: Sequence) -> None:
        """Remove seq and return every page and its slot (idempotent)."""
        if seq.status == SeqStatus.FINISHED:
            return
        if seq.status == SeqStatus.WAITING:
            self.waiting.remove(seq)
        elif seq.status == SeqStatus.PAUSED:
            self.paused.remove(seq)
            seq.recovery.end_pause(self.clock())
            if seq.snapshot is not None:
                assert self.images is not None
                snapshots.drop(self.images, seq.snapshot, self._free_host)
                seq.snapshot = None
                self._transition(seq, "snapshot_revoked")  # it ended before its restore
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
        """Every page, state slot, StateImage and host block is held by exactly the owners that
        reference it (running sequences, retained checkpoints), or free."""
        owners = [s.pages for s in self.running]
        if self.cache is not None:
            self.cache.check_integrity()
            owners += self.cache.page_owners()
        self.pages.check_integrity(owners)
        self.slots.check_integrity()
        if self.images is not None:
            images = self.cache.image_owners() if self.cache is not None else []
            blocks = [i.block for i in images if i.block is not None]
            for s in self.paused:
                if s.snapshot is not None:
                    images.append(s.snapshot.image)
                    blocks += s.snapshot.host_blocks()
            self.images.check_integrity(images)
            self.images.host.check_integrity(blocks)
        for s in self.paused:
            assert s.slot is None and not s.pages, f"{s.request_id}: paused but holds resources"
        slots = sum(1 for s in self.running if s.slot is not None)
        assert slots + self.slots.num_free == self.slots.num_slots, "slots leaked"
        for s in self.running:
            assert s.num_computed <= s.num_scheduled, f"{s.request_id}: computed past scheduled"


def timings_of(seq: Sequence) -> Timings:
    start = seq.t_admitted or seq.arrival
    first = seq.t_first_token
    prompt_ms = (first - start) * 1000.0 if first is not None else 0.0
    last = seq.t_last_token
    predicted_ms = (last - first) * 1000.0 if first is not None and last is not None else 0.0
    return Timings(
        cache_n=seq.num_cached,
        prompt_n=seq.num_prompt - seq.num_cached,
        prompt_ms=prompt_ms,
        predicted_n=seq.num_output,
        predicted_ms=predicted_ms,
        draft_n=seq.spec.drafted_tokens if seq.spec is not None else None,
        draft_n_accepted=seq.spec.accepted_tokens if seq.spec is not None else None,
    )


def _budget_quiet(seq: Sequence, k: int) -> bool:
    """No thinking-budget control suffix can follow any token of seq's round in flight: no
    budget, thinking already closed, or the cap beyond the round's k + 1 tokens."""
    budget = seq.budget
    return budget is None or not budget.is_open or seq.num_output + k + 1 < budget.budget


def _fold_columns(seq: Sequence, committed: tuple[int, ...], accepted: int) -> int:
    """The drafts a chained round folds of the round before it (after t0): the accepted ones,
    up to and including the first stop id among them (`SpecStep._leave_feed`'s rule)."""
    stops = seq.output.stop_token_ids if seq.output is not None else frozenset()
    for n, token in enumerate(committed[:accepted], start=1):
        if token in stops:
            return n
    return accepted
