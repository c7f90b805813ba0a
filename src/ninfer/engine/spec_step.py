"""The speculative round with the MTP head: draft, verify, accept; the state fold comes later.

Imports torch, model/ and kernels/ (through the sampling twin). What runs on the device, per
decode row of an engine loaded with `spec="mtp"`:

- a **round** (row with k drafts, position L): the target verifies [t0, d1..dk] in one step with
  logits on every column (the linear layers column by column with the decode step's ops on
  working copies, recording each column's conv and delta-rule inputs: `ForwardBatch.
  verify_width`, `gated_deltanet.VerifyRecord`); `acceptance.verify` keeps the longest accepted
  prefix a and draws the target's own token t*. The slots keep their pre-round state: once the
  round lands, the scheduler queues a FOLD of the kept columns (a + 1, or fewer when a stop or
  a control token cuts the round), bit for bit the state of feeding those tokens one by one; KV
  past the kept length is simply dead (the next round overwrites it). Then the MTP head runs its
  shifted pass over the verify's hidden states, row j fed (h_j, d_{j+1}) with row a fed
  (h_a, t*), which refreshes its own KV for positions L..L+a; row a's output drafts the next
  d1, and k - 1 autoregressive head steps draft d2..dk into `drafts[slot]`.
- a **chained round** (`SpecInput.chained`: planned while the slot's previous round was still
  in flight, docs/engine.md): before anything reads the slot, the previous round's kept columns
  are folded with counts read on the device (`copies.fold_latest`); inside the round, t0, the
  position and the RNG's output index come from what that round left per slot, and its
  committed tokens join the penalty counts (`_take_feed`). Every round leaves those for a
  successor (`_leave_feed`), whether or not one follows.
- a **fallback step** (no drafts: near the context end, or feeding a known control token): a
  plain decode step of the target, sampled as usual, then the same head pass for its one row.
- after every **prefill chunk** (`prefill_pass`): the head's shifted pass over the chunk, row p
  fed (h_p, token p+1), the last prompt row fed the first sampled token, which drafts d1..dk.

Drafts are the head's argmax (lowest id on ties), so the draft distribution q is one-hot. Results
come back per row as [n committed, a accepted, tokens...]. The penalty counts on the device are
read here, and written only for a chained round's predecessor: the scheduler adds every other
committed token (`StepPlan.count_tokens`).
On CUDA (unless graphs are off) a group of rounds replays one CUDA graph per (batch bucket,
page-table width bucket, parity): the whole round (verify, acceptance, head pass, drafts) over
static buffers, padding rows on a reserved dummy slot and page, attention lengths from the
device (`ForwardBatch.static_shapes`). Two instances per shape alternate, so the verify records
a fold still needs (queued when a round lands, up to one overlapped step later) are never
overwritten by the next replay. Fallback steps and prefill passes run eagerly. `static=True`
without graphs runs the same padded body eagerly (how the CPU tests check it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from ninfer.engine import acceptance
from ninfer.engine.copies import fold_latest
from ninfer.engine.plan import ROUND_STOP_IDS
from ninfer.kernels import dispatch
from ninfer.kernels.sampling.reference import FREQUENCY, GREEDY, PRESENCE, STEP, RowParams
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.lm_head_draft import ShortlistHead
from ninfer.model.mtp import MtpHead
from ninfer.model.qwen3_5 import Qwen3_5Model

HEADER = 2  # result columns before the tokens: number committed, number of drafts accepted
# integer columns of the static staging buffer, before the page table
_T0, _POS, _ROPE, _SLOT, _TOPK, _GREEDY, _SEED, _STEP, _CHAIN, _STOPS = range(10)
_PAGES = _STOPS + ROUND_STOP_IDS
log = logging.getLogger("ninfer.engine.spec")
# `on_drafts(slots, positions)`: called after drafts are written (tests substitute oracles)
OnDrafts = Callable[[torch.Tensor, torch.Tensor], None]


@dataclass
class _Rows:
    """A group of rows as device tensors (what the round body reads)."""

    t0: torch.Tensor  # [B]
    position: torch.Tensor  # [B] KV index of t0
    rope: torch.Tensor  # [B] RoPE offset (a media prompt's delta)
    slots: torch.Tensor  # [B]
    table: torch.Tensor  # [B, width] page ids
    params: RowParams
    max_kv_len: int  # host bound for the verify's attention
    stops: torch.Tensor  # [B, ROUND_STOP_IDS] stop ids, -1 padded (see _leave_feed)
    static: bool = False
    chain: torch.Tensor | None = None  # [B] nonzero: a chained row (t0, position from the feed)


class _Layout(NamedTuple):
    """Where a round's columns sit: shared by its verify and its head pass."""

    positions: torch.Tensor  # [B * W] RoPE positions
    angles: tuple[torch.Tensor, torch.Tensor]  # their (cos, sin), [B * W, R] each
    cu_seqlens: torch.Tensor  # [B + 1] int32


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    out: torch.Tensor  # [bucket, result width]
    records: list


@dataclass(frozen=True)
class SpecInput:
    """One decode row of a speculative engine.

    `token` (t0) sits at KV index `position`; `num_drafts` is k for a round, 0 for a fallback
    step. `next_token` >= 0 is the already known token after t0 (a control token: the step's
    own sample is then discarded) and feeds the head instead of the sample. `pages` cover
    `position + 2k` for a round (the head's drafts write its KV that far ahead).
    """

    token: int
    position: int
    slot: int
    pages: Sequence[int]
    num_drafts: int
    reals: tuple[float, float, float, float, float]
    ints: tuple[int, int, int, int]  # top_k, greedy, seed, step (output index of token L+1)
    next_token: int = -1
    rope_offset: int = 0
    chained: bool = False  # t0 and position (then a bound) come from the slot's previous round
    stop_ids: tuple[int, ...] = ()  # at most ROUND_STOP_IDS: where a chained successor's fold ends


class SpecStep:
    """Rounds and fallback steps of one model, head and cache."""

    def __init__(
        self,
        model: Qwen3_5Model,
        head: MtpHead,
        cache: ModelCache,
        *,
        draft_tokens: int,
        num_sampleable: int,
        counts: torch.Tensor,
        max_batch: int = 1,
        max_pages: int = 1,
        use_graphs: bool = False,
        static: bool = False,
        dummy_slot: int | None = None,
        dummy_page: int | None = None,
        shortlist: ShortlistHead | None = None,
    ) -> None:
        """`counts`: the decode step's per-slot penalty counts (read for penalties only).
        `use_graphs` / `static`: rounds over static buffers (captured, or eager and padded),
        which need `max_batch`, `max_pages` and a dummy slot and page for padding rows.
        `shortlist`: the 4-bit proposal head (`lm_head_draft`) the drafts read instead of the
        full lm_head; verification always uses the full one."""
        self.model = model
        self.shortlist = shortlist
        self.on_drafts: OnDrafts | None = None
        self.max_batch = max_batch
        self.max_pages = max(1, max_pages)
        self.use_graphs = use_graphs
        self.static = static or use_graphs
        self.dummy_slot = dummy_slot
        self.dummy_page = dummy_page
        if self.static and (dummy_slot is None or dummy_page is None):
            raise ValueError("static speculative rounds need a dummy slot and page")
        self._graphs: dict[tuple[int, int, int, str], _Captured] = {}
        self._pool = torch.cuda.graph_pool_handle() if use_graphs else None
        self._parity = 0
        cuda = model.device.type == "cuda"
        width = _PAGES + self.max_pages
        self._host_ints = [
            torch.zeros((max_batch, width), dtype=torch.int64, pin_memory=cuda) for _ in range(2)
        ]
        self._host_reals = [
            torch.zeros((max_batch, 5), dtype=torch.float64, pin_memory=cuda) for _ in range(2)
        ]
        self._turn = 0
        self._ints_buf = torch.zeros((max_batch, width), dtype=torch.int64, device=model.device)
        self._reals_buf = torch.zeros((max_batch, 5), dtype=torch.float64, device=model.device)
        self.head = head
        self.cache = cache
        self.k = draft_tokens
        self.num_sampleable = num_sampleable
        self.counts = counts
        self.device = model.device
        self._generation = 0  # verify steps run, for dropping old verify records
        self._born: dict[int, int] = {}  # slot -> the generation of its kept records
        self.drafts = torch.zeros(
            (max(cache.num_slots, 1), draft_tokens), dtype=torch.int64, device=self.device
        )
        # what each slot's latest round left for a chained round after it: its t0 (the token
        # the round committed last), that token's KV index and output index, the columns the
        # round kept (its fold) and its committed tokens (-1 padded: the penalty counts)
        # one [4, slots] block, so a round writes (and a chained one reads) them in one launch
        self._feeds = torch.zeros(
            (4, max(cache.num_slots, 1)), dtype=torch.int64, device=self.device
        )
        self.feed_columns = self._feeds[3]  # what `run` folds for a chained round
        self.feed_committed = torch.full(
            (max(cache.num_slots, 1), draft_tokens + 1), -1, dtype=torch.int64, device=self.device
        )

    @property
    def result_width(self) -> int:
        return HEADER + self.k + 1

    # -- decode rows ---------------------------------------------------------------------------
    def run(self, rows: Sequence[SpecInput]) -> torch.Tensor:
        """Rounds and fallback steps; returns [B, HEADER + k + 1] int64 on the device, in row
        order: (n, a, the n committed tokens, padding)."""
        chained = [r.slot for r in rows if r.chained]
        if chained:  # the previous round of these slots is folded on the device first
            fold_latest(self.cache, chained, self.feed_columns, self.device, most=self.k + 1)
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(r.num_drafts, []).append(i)
        if len(groups) == 1:  # one kind of row (the usual step): already in row order
            return self._group(rows)
        out = torch.zeros((len(rows), self.result_width), dtype=torch.int64, device=self.device)
        for index in groups.values():
            result = self._group([rows[i] for i in index])
            index_t = torch.tensor(index, dtype=torch.int64).to(self.device, non_blocking=True)
            out.index_copy_(0, index_t, result)
        return out

    def _group(self, rows: Sequence[SpecInput]) -> torch.Tensor:
        """Rows of one draft count: fallback steps, or rounds (static or eager)."""
        if not rows[0].num_drafts:
            return self._fallback(rows)
        return self._round_static(rows) if self.static else self._round(rows)

    def _round(self, rows: Sequence[SpecInput]) -> torch.Tensor:
        """Rounds at their exact batch size (eager)."""
        assert all(r.num_drafts == self.k for r in rows)
        pages = max(len(r.pages) for r in rows)
        group = _Rows(
            t0=self._ints([r.token for r in rows]),
            position=self._ints([r.position for r in rows]),
            rope=self._ints([r.rope_offset for r in rows]),
            slots=self._ints([r.slot for r in rows]),
            table=self._table(rows, pages),
            params=self._params(rows),
            max_kv_len=max(r.position for r in rows) + self.k + 1,
            chain=self._ints([r.chained for r in rows]) if any(r.chained for r in rows) else None,
            stops=self._ints([_stop_columns(r) for r in rows]),
        )
        page_size = self.cache.page_size
        bound = max(r.position for r in rows) + 2 * self.k
        covered = all(r.position + 2 * self.k <= len(r.pages) * page_size for r in rows)
        result, records = self._round_body(
            group, _acceptance_mode(rows), draft_bound=bound if covered else None
        )
        self._record(records, [r.slot for r in rows])
        if self.on_drafts is not None:
            self.on_drafts(group.slots, group.position + result[:, 1])
        return result

    def _round_body(
        self, rows: _Rows, mode: str, *, draft_bound: int | None
    ) -> tuple[torch.Tensor, list]:
        """The round on device tensors; returns (results [B, width], verify records).
        `mode`: the acceptance (`_acceptance_mode`); `draft_bound`: a host bound on the head's KV
        length while drafting (None: the pages do not reach k - 1 positions ahead, only d1 is
        drafted)."""
        width = self.k + 1
        num = rows.t0.shape[0]
        if rows.chain is not None:
            self._take_feed(rows)
        ids = torch.cat((rows.t0[:, None], self.drafts.index_select(0, rows.slots)), dim=1)
        layout = self._group_layout(rows, width)  # the verify's and the head pass's
        batch = self._group_batch(rows, ids, layout, verify=True)
        hidden = self.model.forward_hidden(batch, self.cache)  # [B * W, H]
        logits = self.model.compute_logits(hidden).view(num, width, -1)
        counts = self._counts(mode)
        given = {
            "rows": rows.params,
            "num_sampleable": self.num_sampleable,
            "counts": counts,
            "count_rows": rows.slots if counts is not None else None,
        }
        # greedy rounds hand the target's tokens to the commit, which compares them with the
        # drafts; other rounds their verify's committed tokens and counts
        if mode in (GREEDY_ROUND, PENALIZED_GREEDY_ROUND):
            decided = {"target": acceptance.greedy_targets(logits, ids[:, 1:], **given)}
        else:
            committed, accepted = acceptance.verify(logits, ids[:, 1:], **given)
            decided = {"committed": committed, "accepted": accepted}
        # what the round keeps, the head pass's ids, the result rows
        kept = dispatch.round_commit(ids, rows.position, HEADER, self.result_width, **decided)
        # the head's shifted pass over the verify: row j sees (h_j, d_{j+1}); row a (h_a, t*)
        head_batch = self._group_batch(rows, kept.next_ids, layout, verify=False)
        head_hidden = self.head.forward_hidden(head_batch, self.cache, hidden)  # [B * W, H]
        self._draft_tensors(
            rows.slots,
            head_hidden.index_select(0, kept.gather),  # [B, H]: row a of each
            kept.draft_position,
            rows.rope,
            rows.table,
            bound=draft_bound,
            static=rows.static,
        )
        self._leave_feed(rows, kept.accepted, kept.committed)
        return kept.result, batch.verify_states or []

    def _take_feed(self, rows: _Rows) -> None:
        """A chained row's t0, position and output index (in place: a static round's staged
        columns) from what its slot's previous round left, and that round's committed tokens
        added to the slot's penalty counts (the host, which adds every other committed token,
        leaves these out: `Scheduler._land_spec`)."""
        assert rows.chain is not None
        dispatch.take_feed(
            rows.t0,
            rows.position,
            rows.params.ints[:, STEP],
            rows.chain,
            rows.slots,
            self._feeds,
            self.feed_committed,
            self.counts,
        )

    def _leave_feed(self, rows: _Rows, accepted: torch.Tensor, committed: torch.Tensor) -> None:
        """What a chained round after this one reads: the token committed last (its t0), the
        KV index it goes to, and the columns this round keeps (its fold): t0 and the accepted
        drafts up to the first stop id among them, where the host's commit ends the request
        (`scheduler._fold_columns`), so a conversation kept at that stop holds its state."""
        dispatch.leave_feed(
            self._feeds,
            self.feed_committed,
            rows.slots,
            rows.position,
            rows.params.ints[:, STEP],
            rows.stops,
            accepted,
            committed,
        )

    def _group_layout(self, rows: _Rows, width: int) -> _Layout:
        """RoPE positions [B * width], their angles and cu_seqlens [B + 1] of `width` columns
        per row from each row's position: the verify and the head pass of a round share them."""
        num = rows.position.shape[0]
        cols = torch.arange(width, device=self.device)
        positions = (rows.position[:, None] + cols[None, :] + rows.rope[:, None]).reshape(-1)
        cu = torch.arange(0, (num + 1) * width, width, dtype=torch.int32, device=self.device)
        return _Layout(positions, self.model.rope.cos_sin(positions), cu)

    def _group_batch(
        self,
        rows: _Rows,
        ids: torch.Tensor,
        layout: _Layout,
        *,
        verify: bool,
    ) -> ForwardBatch:
        num, width = ids.shape
        return ForwardBatch(
            input_ids=ids.reshape(-1),
            positions=layout.positions,
            rope_angles=layout.angles,
            cu_seqlens=layout.cu_seqlens,
            num_computed=rows.position,
            page_table=rows.table,
            state_slots=rows.slots,
            query_lens=(width,) * num,
            max_kv_len=rows.max_kv_len,
            verify_width=width if verify else 0,
            verify_states=[] if verify else None,
            static_shapes=rows.static,
        )

    # -- static rounds (CUDA graphs) -----------------------------------------------------------
    def _round_static(self, rows: Sequence[SpecInput]) -> torch.Tensor:
        """Rounds over the static buffers: staged, then the captured graph replayed (or, with
        `static` and no graphs, the same padded body run eagerly)."""
        num = len(rows)
        if num > self.max_batch:
            raise ValueError(f"{num} rounds do not fit max_batch {self.max_batch}")
        size = _bucket(num, self.max_batch)
        width = _width(max(len(r.pages) for r in rows), self.max_pages)
        mode = _acceptance_mode(rows)
        self._stage(rows, size, width)
        parity, self._parity = self._parity, self._parity ^ 1
        if self.use_graphs:
            try:
                captured = self._get(size, width, parity, mode)
            except RuntimeError as e:  # capture touched only the dummy slot: go eager for good
                log.warning("speculative rounds run eagerly: %s", e)
                self.use_graphs = self.static = False
                return self._round(rows)
            captured.graph.replay()
            result, records = captured.out, captured.records
        else:
            result, records = self._static_body(size, width, mode)
        self._record(records, [r.slot for r in rows])
        if self.on_drafts is not None:
            slots = self._ints_buf[:num, _SLOT]
            self.on_drafts(slots, self._ints_buf[:num, _POS] + result[:num, 1])
        return result[:num]

    def _static_body(self, size: int, width: int, mode: str) -> tuple[torch.Tensor, list]:
        """`mode` (`_acceptance_mode`): which acceptance the graph holds."""
        ints = self._ints_buf[:size]
        page_size = self.cache.page_size
        rows = _Rows(
            t0=ints[:, _T0],
            position=ints[:, _POS],
            rope=ints[:, _ROPE],
            slots=ints[:, _SLOT],
            table=ints[:, _PAGES : _PAGES + width],
            params=RowParams(self._reals_buf[:size], ints[:, _TOPK : _STEP + 1]),
            max_kv_len=width * page_size,
            static=True,
            chain=ints[:, _CHAIN],
            stops=ints[:, _STOPS:_PAGES],
        )
        return self._round_body(rows, mode, draft_bound=width * page_size)

    def _stage(self, rows: Sequence[SpecInput], size: int, width: int) -> None:
        ints = self._host_ints[self._turn]
        reals = self._host_reals[self._turn]
        self._turn ^= 1
        cols = _PAGES + width
        table = [
            [r.token, r.position, r.rope_offset, r.slot, *r.ints, int(r.chained)]
            + _stop_columns(r)
            + list(r.pages)
            + [r.pages[0]] * (width - len(r.pages))
            for r in rows
        ]
        ints[: len(rows), :cols] = torch.tensor(table, dtype=torch.int64)
        reals[: len(rows)] = torch.tensor([r.reals for r in rows], dtype=torch.float64)
        if size > len(rows):  # padding rows: the dummy slot and page, greedy
            self._pad(ints[len(rows) : size], reals[len(rows) : size], width)
        # NOTE: non_blocking from pinned memory; a host buffer is refilled two rounds later,
        # after the engine has waited for the step that copied it.
        self._ints_buf[:size, :cols].copy_(ints[:size, :cols], non_blocking=True)
        self._reals_buf[:size].copy_(reals[:size], non_blocking=True)

    def _pad(self, ints: torch.Tensor, reals: torch.Tensor, width: int) -> None:
        ints.zero_()
        ints[:, _SLOT] = self.dummy_slot
        ints[:, _PAGES : _PAGES + width] = self.dummy_page
        ints[:, _TOPK] = 1
        ints[:, _GREEDY] = 1
        reals.copy_(torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64))

    def _get(self, size: int, width: int, parity: int, mode: str) -> _Captured:
        key = (size, width, parity, mode)
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._graphs[key] = self._capture(size, width, mode)
        return captured

    def _capture(self, size: int, width: int, mode: str) -> _Captured:
        # Capture on padding-only inputs (the dummy slot and page); the staged rows come back
        # afterwards. A capture's own writes land on the dummy slot, page and drafts row only.
        saved_ints = self._ints_buf[:size].clone()
        saved_reals = self._reals_buf[:size].clone()
        saved_drafts = self.drafts[self.dummy_slot].clone()
        self._pad(self._ints_buf[:size], self._reals_buf[:size], width)
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):  # warm-up: handles, kernel compilation, allocator pools
            self._static_body(size, width, mode)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            out, records = self._static_body(size, width, mode)
        self._ints_buf[:size].copy_(saved_ints)
        self._reals_buf[:size].copy_(saved_reals)
        self.drafts[self.dummy_slot] = saved_drafts
        log.debug("captured speculative round: batch %d, %d pages wide", size, width)
        return _Captured(graph, out, records)

    def _fallback(self, rows: Sequence[SpecInput]) -> torch.Tensor:
        num = len(rows)
        slots = self._ints([r.slot for r in rows])
        ids = self._ints([r.token for r in rows])[:, None]
        batch = self._batch(rows, ids, 1, verify=False)
        hidden = self.model.forward_hidden(batch, self.cache)  # [B, H]
        logits = self.model.compute_logits(hidden)[:, None]
        counts = self._counts(_acceptance_mode(rows))
        committed, _ = acceptance.verify(
            logits,
            ids[:, :0],
            self._params(rows),
            num_sampleable=self.num_sampleable,
            counts=counts,
            count_rows=slots if counts is not None else None,
        )
        known = self._ints([r.next_token for r in rows])
        next_ids = torch.where(known >= 0, known, committed[:, 0])[:, None]
        head_batch = self._batch(rows, next_ids, 1, verify=False)
        last = self.head.forward_hidden(head_batch, self.cache, hidden)
        positions = self._ints([r.position for r in rows])
        self._draft(rows, slots, last, positions, horizon=[r.position for r in rows])
        if self.on_drafts is not None:
            self.on_drafts(slots, positions)
        ones = torch.ones(num, dtype=torch.int64, device=self.device)
        return self._result(ones, ones * 0, committed)

    # -- prefill -------------------------------------------------------------------------------
    def prefill_pass(
        self,
        batch: ForwardBatch,
        hidden: torch.Tensor,
        known: Sequence[int],
        sample: torch.Tensor | None,
        *,
        start: int,
        pages: Sequence[int],
        slot: int,
        rope_offset: int = 0,
    ) -> None:
        """The head's shifted pass over a prefill chunk of one sequence starting at KV index
        `start`: row p fed (h_p, token p+1), the next tokens being `known` then, for the chunk
        that ends the prompt, `sample` ([1], the first output token on the device), whose row
        then drafts d1..dk into the slot's drafts."""
        ids = self._ints(known)
        if sample is not None:
            ids = torch.cat((ids, sample.reshape(1).to(torch.int64)))
        num = ids.shape[0]
        if num == 0:
            return
        head_batch = ForwardBatch(
            input_ids=ids.reshape(-1),
            positions=batch.positions[..., :num],
            cu_seqlens=torch.tensor([0, num], dtype=torch.int32, device=self.device),
            num_computed=batch.num_computed,
            page_table=batch.page_table,
            state_slots=batch.state_slots,
            query_lens=(num,),
            max_kv_len=start + num,
        )
        out = self.head.forward_hidden(head_batch, self.cache, hidden[:num])
        if sample is None:
            return
        last = start + num - 1
        row = SpecInput(
            token=-1,
            position=last,
            slot=slot,
            pages=pages,
            num_drafts=0,
            reals=(1.0, 1.0, 0.0, 0.0, 0.0),
            ints=(1, 1, 0, 0),
            rope_offset=rope_offset,
        )
        slots, positions = self._ints([slot]), self._ints([last])
        self._draft([row], slots, out[num - 1 :], positions, horizon=[last])
        if self.on_drafts is not None:
            self.on_drafts(slots, positions)

    # -- pieces --------------------------------------------------------------------------------
    def _draft(
        self,
        rows: Sequence[SpecInput],
        slots: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        *,
        horizon: Sequence[int],
    ) -> None:
        """Drafts of eager rows (fallback steps, prefill): `horizon` is a host bound on each
        row's position; autoregressive head steps run only when every row's pages reach k - 1
        positions beyond it (else only d1 is drafted and repeated)."""
        page_size = self.cache.page_size
        reach = all(
            h + self.k - 1 < len(r.pages) * page_size for h, r in zip(horizon, rows, strict=True)
        )
        width = max(len(r.pages) for r in rows)
        self._draft_tensors(
            slots,
            hidden,
            positions,
            self._ints([r.rope_offset for r in rows]),
            self._table(rows, width),
            bound=max(horizon) + self.k if reach else None,
        )

    def _draft_tensors(
        self,
        slots: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        rope: torch.Tensor,
        table: torch.Tensor,
        *,
        bound: int | None,
        static: bool = False,
    ) -> None:
        """d1 from the head's output `hidden` (its row at KV index `positions`), then k - 1
        autoregressive head steps at positions + 1.. (when `bound`, a host bound on the KV
        length they reach, is given; else d1 is repeated). Writes `drafts[slots]`."""
        k = self.k
        d = self._propose(hidden)
        if bound is None or k == 1:
            self.drafts.index_copy_(0, slots, d[:, None].expand(-1, k))
            return
        num = slots.shape[0]
        limit = table.shape[1] * self.cache.page_size
        # every head step's KV index and RoPE position at once: [k - 1, B]
        ahead = positions[None, :] + torch.arange(1, k, device=self.device)[:, None]
        rope_at = ahead + rope[None, :]
        cos, sin = (a.view(k - 1, num, -1) for a in self.model.rope.cos_sin(rope_at.reshape(-1)))
        cu = torch.arange(num + 1, dtype=torch.int32, device=self.device)
        h, tok, proposed = hidden, d, [d]
        for i in range(1, k):
            step = ForwardBatch(
                input_ids=tok,
                positions=rope_at[i - 1],
                rope_angles=(cos[i - 1], sin[i - 1]),
                cu_seqlens=cu,
                num_computed=ahead[i - 1],
                page_table=table,
                state_slots=slots,
                query_lens=(1,) * num,
                max_kv_len=min(bound + 1, limit),
                static_shapes=static,
            )
            h = self.head.forward_hidden(step, self.cache, h)
            tok = self._propose(h)
            proposed.append(tok)
        self.drafts.index_copy_(0, slots, torch.stack(proposed, dim=1))

    def _record(self, records: list, slot_ids: Sequence[int]) -> None:
        """Keep the verify's records for the fold the scheduler queues once the round lands
        (the slots' state is still the pre-round one)."""
        # Keep this step's records and the previous step's: a fold is queued when a round
        # lands, which (overlapped loop) may be after one more verify step was launched. Older
        # ones are dropped, so a finished sequence's records do not pin device memory.
        self._generation += 1
        kept = self.cache.verify_records
        for row, slot in enumerate(slot_ids):
            kept[slot] = (row, records)
            self._born[slot] = self._generation
        for slot in [s for s, g in self._born.items() if g < self._generation - 1]:
            kept.pop(slot, None)
            del self._born[slot]

    def _batch(
        self, rows: Sequence[SpecInput], ids: torch.Tensor, width: int, *, verify: bool
    ) -> ForwardBatch:
        num = len(rows)
        start = self._ints([r.position for r in rows])
        cols = torch.arange(width, device=self.device)
        kv = start[:, None] + cols[None, :]
        offsets = self._ints([r.rope_offset for r in rows])
        pages = max(len(r.pages) for r in rows)
        return ForwardBatch(
            input_ids=ids.reshape(-1),
            positions=(kv + offsets[:, None]).reshape(-1),
            cu_seqlens=torch.arange(num + 1, dtype=torch.int32, device=self.device) * width,
            num_computed=start,
            page_table=self._table(rows, pages),
            state_slots=self._ints([r.slot for r in rows]),
            query_lens=(width,) * num,
            max_kv_len=max(r.position for r in rows) + width,
            verify_width=width if verify else 0,
            verify_states=[] if verify else None,
        )

    def _table(self, rows: Sequence[SpecInput], width: int) -> torch.Tensor:
        table = [list(r.pages) + [r.pages[0]] * (width - len(r.pages)) for r in rows]
        return torch.tensor(table, dtype=torch.int32).to(self.device)

    def _params(self, rows: Sequence[SpecInput]) -> RowParams:
        return RowParams.pack([r.reals for r in rows], [r.ints for r in rows], self.device)

    def _counts(self, mode: str) -> torch.Tensor | None:
        """The penalty counts the acceptance reads: only a penalized round's."""
        return self.counts if mode in (PENALIZED_ROUND, PENALIZED_GREEDY_ROUND) else None

    def _propose(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's proposal from its output hidden: the argmax over sampleable ids (torch
        returns the lowest on ties), through the shortlist head when there is one."""
        if self.shortlist is not None:
            return self.shortlist.propose(hidden)
        return self.head.compute_logits(hidden)[:, : self.num_sampleable].argmax(dim=-1)

    def _result(
        self, num: torch.Tensor, accepted: torch.Tensor, committed: torch.Tensor
    ) -> torch.Tensor:
        out = torch.zeros((num.shape[0], self.result_width), dtype=torch.int64, device=self.device)
        out[:, 0] = num
        out[:, 1] = accepted
        out[:, HEADER : HEADER + committed.shape[1]] = committed
        return out

    def _ints(self, values: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(values), dtype=torch.int64).to(self.device)


GREEDY_ROUND, PENALIZED_GREEDY_ROUND = "greedy", "penalized_greedy"
PLAIN_ROUND, PENALIZED_ROUND = "plain", "penalized"


def _acceptance_mode(rows: Sequence[SpecInput]) -> str:
    """Which acceptance a round's graph holds. Every row greedy: the argmax walk
    (`acceptance.verify_greedy`), over penalized logits where a row has a presence or
    frequency penalty (PENALIZED_GREEDY_ROUND; the 35B-A3B's presets carry a presence
    penalty, so its greedy rows are these). Otherwise every column's survivors at once, with
    penalty counts where a row has a penalty (PENALIZED_ROUND). Each gives, on its rows, what
    the column walk gives."""
    penalized = any(r.reals[PRESENCE] or r.reals[FREQUENCY] for r in rows)
    if all(r.ints[GREEDY] for r in rows):
        return PENALIZED_GREEDY_ROUND if penalized else GREEDY_ROUND
    return PENALIZED_ROUND if penalized else PLAIN_ROUND


def _bucket(num_rows: int, max_batch: int) -> int:
    from ninfer.engine.graphs import bucket_for

    return bucket_for(num_rows, max_batch)


def _width(num_pages: int, max_pages: int) -> int:
    """The page-table width bucket (powers of two up to max_pages), as the decode step's."""
    if not 0 < num_pages <= max_pages:
        raise ValueError(f"{num_pages} pages do not fit the round width {max_pages}")
    width = 1
    while width < num_pages:
        width *= 2
    return min(width, max_pages)


def _stop_columns(row: SpecInput) -> list[int]:
    return list(row.stop_ids) + [-1] * (ROUND_STOP_IDS - len(row.stop_ids))
