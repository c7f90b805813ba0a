"""Step plans: what one engine step computes, as plain data, and what it produced.

No torch and no policy. `Scheduler.schedule()` writes a `StepPlan`, a runner executes it (and may
still be executing it while the next plan is written: the overlapped loop), `Scheduler.update()`
reads the `StepOutcome` and is the only code that advances a sequence's computed and committed
tokens. Prefill chunks, decode rows, and later verify and replay rows are one shape: a row feeds
`num_new_tokens` tokens of one sequence starting at `start` and may sample the next token.
Copies between state slots, StateImages, KV pages and the host pool are `CopyOp`s the runner
performs, in plan order, before the step's forwards (captures at checkpoints: after their row).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any, Protocol

# A token id not known on the host when the plan is written: the sample of the step in flight,
# which the runner reads on the device (per state slot) instead.
FROM_DEVICE = -1
# The most stop token ids a speculative round checks on the device, so that the round chained
# behind it folds exactly to a stop inside it (a request with more never chains)
ROUND_STOP_IDS = 4


STATE = "state"  # CopyOp kind: one StateImage (conv + recurrent state of every linear layer)
PAGES = "pages"  # CopyOp kind: KV pages (K and V of every full-attention layer)
# CopyOp kind: lanes' recurrent state advanced over the kept columns of their latest verify step
# (a speculative round leaves the state alone; how many tokens it keeps is known when it lands)
FOLD = "fold"


@dataclass(frozen=True)
class CopyOp:
    """One copy the runner performs before the step's forwards, in plan order.

    STATE: `src[0]` -> `dst[0]`, each a device state slot, or a host block id when the side's
    `*_host` flag is set. FOLD: state slot `dst[i]` advances over the first `src[i]` columns
    of its latest verify step. PAGES: device pages `src[i]` -> `dst[i]`; towards the
    host, `dst[0]` is one host block holding the pages in order; from the host, `src[0]` is
    that block and `dst` the device pages.
    """

    kind: str
    src: tuple[int, ...]
    dst: tuple[int, ...]
    src_host: bool = False
    dst_host: bool = False

    def __post_init__(self) -> None:
        assert self.kind in (STATE, PAGES, FOLD), self.kind
        if self.kind == STATE or not (self.src_host or self.dst_host):
            assert len(self.src) == len(self.dst), (self.src, self.dst)


@dataclass(frozen=True)
class Row:
    """One sequence's part of a step.

    `token_ids[i]` is the token at position `start + i`, or FROM_DEVICE for the one token (always
    the last, of a decode row) that the step in flight is still sampling. `pages` is the page
    table covering `start + num_new_tokens` tokens; `slot` the sequence's state slot.
    `logits` is "last" (the row's last column) or "all" (every column: a verify row) or "none".
    A sampling row draws output token number `sample_index` (0 = the request's first) from its
    last column. `checkpoint_at` lists token offsets (relative to `start`) after which the
    recurrent state is captured, by the copies in `after` (run right after the row's forward);
    the scheduler ends chunks at checkpoints, so the only offset used today is the row's end.
    `first` marks the first row of a residency: the runner clears the slot's
    penalty counts (and, when `start == 0`, its state; otherwise a restore op filled it).
    """

    seq: Any  # the scheduler's Sequence (plain data; typed Any to keep this module a leaf)
    start: int
    token_ids: tuple[int, ...]
    pages: tuple[int, ...]
    slot: int
    samples: bool
    sample_index: int = 0
    logits: str = "last"
    count_sample: bool = True  # the sample may be kept: penalty counts include it
    checkpoint_at: tuple[int, ...] = ()
    after: tuple[CopyOp, ...] = ()
    first: bool = False
    # speculative decoding: a decode row of an engine with an MTP head. `num_drafts` > 0 makes it
    # a verify row (t0 then that many drafts read on the device; logits "all"); 0 is a plain
    # decode step that still runs the head (a fallback step)
    spec: bool = False
    num_drafts: int = 0
    # a round planned while the sequence's previous round is still in flight (`chained`): its
    # t0, true start and the previous round's fold come from the device; `start` is then only
    # an upper bound (the previous round's start + k + 1), which the pages cover
    chained: bool = False

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def positions(self) -> range:
        return range(self.start, self.start + self.num_new_tokens)

    @property
    def is_decode(self) -> bool:
        return self.num_new_tokens == 1 and self.start >= self.seq.num_prompt

    @property
    def fresh(self) -> bool:
        """The row starts the sequence from nothing: its state slot must be zeroed first."""
        return self.first and self.start == 0


@dataclass(frozen=True)
class StepPlan:
    """Decode rows first (one token each), then prefill chunks, in scheduling order.

    `uncount_slots`: state slots whose most recent sample (made by the step in flight) turned out
    to be discarded; the runner removes it from the penalty counts before this step samples.
    `count_tokens`: (slot, token id) pairs committed without sampling (inserted control tokens)
    that the penalty counts must add. `recount`: (slot, output ids) of sequences resuming after a
    pause: the slot's counts are set to exactly those ids. `copies` run first, in order;
    `free_host` lists host blocks released after them.
    """

    decode: tuple[Row, ...] = ()
    prefill: tuple[Row, ...] = ()
    uncount_slots: tuple[int, ...] = ()
    count_tokens: tuple[tuple[int, int], ...] = ()
    copies: tuple[CopyOp, ...] = ()
    free_host: tuple[int, ...] = ()
    recount: tuple[tuple[int, tuple[int, ...]], ...] = ()

    @property
    def rows(self) -> tuple[Row, ...]:
        return self.decode + self.prefill

    @property
    def is_empty(self) -> bool:
        """Nothing to compute (copies alone travel with the next plan that computes)."""
        return not self.decode and not self.prefill

    @property
    def num_tokens(self) -> int:
        return sum(r.num_new_tokens for r in self.rows)


@dataclass(frozen=True)
class StepOutcome:
    """`sampled[i]` is the token drawn by `plan.rows[i]`, or None for a row that does not sample.

    Speculative rows (`Row.spec`) also have `committed[i]`: the accepted drafts then the target's
    own token (a + 1 tokens, in order), and `accepted[i]` = a; both are empty for other plans.
    """

    sampled: tuple[int | None, ...]
    committed: tuple[tuple[int, ...] | None, ...] = ()
    accepted: tuple[int, ...] = ()


class Launched(Protocol):
    """A step handed to the device; `wait()` blocks until its sampled ids are on the host."""

    plan: StepPlan

    def wait(self) -> StepOutcome: ...


@dataclass(frozen=True)
class Completed:
    """A step that ran synchronously (fake runners in tests): its outcome is already known."""

    plan: StepPlan
    outcome: StepOutcome

    def wait(self) -> StepOutcome:
        return self.outcome


class Runner(Protocol):
    def launch(self, plan: StepPlan) -> Launched: ...


def outcome_of(plan: StepPlan, tokens: Seq[int]) -> StepOutcome:
    """Spread `tokens` (one per sampling row, in row order) over the plan's rows."""
    it = iter(tokens)
    return StepOutcome(tuple(next(it) if r.samples else None for r in plan.rows))
