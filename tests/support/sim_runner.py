"""A runner that simulates the device memory a plan touches, for scheduler tests without a model.

A state slot holds the exact token history fed into it, a KV page the token at each position,
a host block whatever was copied there; every `CopyOp` of a plan moves these, in plan order, and
every row checks that its slot and pages hold exactly its sequence's tokens before it feeds its
own. A sample is a hash of the fed history, so a wrong state gives a wrong token (and its cold
run, on a fresh scheduler, is the reference). Test-only: nothing in `src/` can reach it.
"""

from __future__ import annotations

from ninfer.engine.plan import (
    FROM_DEVICE,
    PAGES,
    STATE,
    Completed,
    CopyOp,
    Row,
    StepPlan,
    outcome_of,
)

EOS = 248046


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
