"""A runner that simulates the device memory a plan touches, for scheduler tests without a model.

A state slot holds the exact token history fed into it, a KV page the token at each position,
a host block whatever was copied there; every `CopyOp` of a plan moves these, in plan order, and
every row checks that its slot and pages hold exactly its sequence's tokens before it feeds its
own. A sample is a hash of the fed history, so a wrong state gives a wrong token (and its cold
run, on a fresh scheduler, is the reference). `SimEngine` puts it under a real scheduler and
core. Test-only: nothing in `src/` can reach it.
"""

from __future__ import annotations

import time

from ninfer.engine.core import EngineCore
from ninfer.engine.kv_pool import PagePool
from ninfer.engine.plan import (
    FROM_DEVICE,
    PAGES,
    STATE,
    Completed,
    CopyOp,
    Row,
    StepOutcome,
    StepPlan,
    outcome_of,
)
from ninfer.engine.prefix_cache import PrefixCache
from ninfer.engine.request import EngineEvent, EventKind, GenerationRequest
from ninfer.engine.sampling import SamplingParams
from ninfer.engine.scheduler import Scheduler, SchedulerConfig
from ninfer.engine.state_images import HostPool, StateImages
from ninfer.engine.state_slots import SlotPool

EOS = 248046
PAGE = 4
IMAGE_BYTES = 100


def sample_of(history: tuple[int, ...], index: int, eos_at: int | None) -> int:
    if eos_at is not None and index == eos_at:
        return EOS
    return 1000 + hash((history, index)) % 5000


class SimRunner:
    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.state: dict[int, tuple[int, ...]] = {}
        self.pages: dict[int, list[int | None]] = {}
        self.host: dict[int, object] = {}
        self.last: dict[int, int] = {}  # slot -> latest sample (what FROM_DEVICE reads)
        self.errors: list[str] = []
        self.plans: list[StepPlan] = []

    def launch(self, plan: StepPlan) -> Completed:
        self.plans.append(plan)
        self._copies(plan.copies)
        for block in plan.free_host:
            self.host.pop(block, None)
        for row in plan.rows:
            if row.fresh:
                self.state[row.slot] = ()
        tokens = []
        for row in plan.rows:
            sample = self._row(row)
            if row.samples:
                tokens.append(sample)
        return Completed(plan, outcome_of(plan, tokens))

    def _row(self, row: Row) -> int | None:
        seq, p = row.seq, self.page_size
        want = tuple(seq.token_ids[: row.start])
        have = self.state.get(row.slot)
        if have != want:
            self.errors.append(f"{seq.request_id}@{row.start}: state holds {len(have or ())} "
                               f"tokens that are not its first {row.start}")  # fmt: skip
        for pos in range(row.start):
            page = self.pages.get(row.pages[pos // p])
            if page is None or page[pos % p] != seq.token_ids[pos]:
                self.errors.append(f"{seq.request_id}: KV at {pos} is not its token")
                break
        fed = []
        for i, token in enumerate(row.token_ids):
            if token == FROM_DEVICE:
                token = self.last[row.slot]
            pos = row.start + i
            page = self.pages.setdefault(row.pages[pos // p], [None] * p)
            page[pos % p] = token
            fed.append(token)
        history = (have or ()) + tuple(fed)  # what the device holds, right or wrong
        self.state[row.slot] = history
        self._copies(row.after)
        if not row.samples:
            return None
        sample = sample_of(history, row.sample_index, seq.request.sampling.get("eos_at"))
        self.last[row.slot] = sample
        return sample

    def _copies(self, copies: tuple[CopyOp, ...]) -> None:
        for op in copies:
            if op.kind == STATE:
                src = self.host[op.src[0]] if op.src_host else self.state.get(op.src[0])
                if op.dst_host:
                    self.host[op.dst[0]] = src
                else:
                    self.state[op.dst[0]] = src  # type: ignore[assignment]
            else:
                assert op.kind == PAGES
                if op.src_host:
                    data = self.host[op.src[0]]
                else:
                    data = [list(self.pages.get(s, [None] * self.page_size)) for s in op.src]
                if op.dst_host:
                    self.host[op.dst[0]] = data
                else:
                    for d, content in zip(op.dst, data, strict=True):  # type: ignore[call-overload]
                        self.pages[d] = list(content)


class SimEngine:
    """A scheduler + core over the simulated device, integrity checked after every step."""

    def __init__(
        self,
        tokenizer,
        *,
        lanes=2,
        pages=64,
        extra_slots=2,
        host_images=4,
        chunk=8,
        max_context=128,
        budget=None,
        cache=True,
        overlap=True,
    ) -> None:
        self.pages = PagePool(pages, PAGE)
        self.images = StateImages(
            range(lanes, lanes + extra_slots), HostPool(host_images * IMAGE_BYTES), IMAGE_BYTES
        )
        self.cache = PrefixCache(self.pages, self.images) if cache else None
        self.sched = Scheduler(
            SchedulerConfig(
                max_concurrency=lanes,
                max_pending=400,
                prefill_chunk=chunk,
                max_context=max_context,
                max_batched_tokens=budget,
            ),
            self.pages,
            SlotPool(lanes),
            images=self.images,
            cache=self.cache,
        )
        update = self.sched.update

        def checked(plan: StepPlan, outcome: StepOutcome):
            events = update(plan, outcome)
            self.sched.check_integrity()
            return events

        self.sched.update = checked  # type: ignore[method-assign]
        self.runner = SimRunner(PAGE)
        self.core = EngineCore(
            self.sched,
            self.runner,
            tokenizer,
            eos_token_ids=frozenset({EOS}),
            resolve_sampling=lambda r: SamplingParams(greedy=True),
            overlap=overlap,
        )

    def run(self, request: GenerationRequest) -> list[EngineEvent]:
        events: list[EngineEvent] = []
        self.core.submit(request, events.append)
        self.wait_idle()
        return events

    def wait_idle(self) -> None:
        for _ in range(3000):
            if self.core._num_live == 0 and not self.sched.has_work:
                return
            time.sleep(0.005)
        raise AssertionError("engine did not go idle")

    def close(self) -> None:
        self.core.close()
        assert not self.runner.errors, self.runner.errors[:5]
        self.sched.check_integrity()


def req(prompt, max_tokens=6, checkpoints=(), **kw) -> GenerationRequest:
    sampling = {"eos_at": kw.pop("eos_at")} if "eos_at" in kw else {}
    return GenerationRequest(
        tuple(prompt), max_tokens, sampling=sampling, cache_checkpoints=tuple(checkpoints), **kw
    )


def out(events: list[EngineEvent]) -> list[int]:
    return [t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids]


def admitted(events: list[EngineEvent]) -> EngineEvent:
    return next(e for e in events if e.kind == EventKind.ADMITTED)


def prompt(n: int, base: int = 10) -> list[int]:
    return list(range(base, base + n))
