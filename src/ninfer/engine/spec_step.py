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
- a **fallback step** (no drafts: near the context end, or feeding a known control token): a
  plain decode step of the target, sampled as usual, then the same head pass for its one row.
- after every **prefill chunk** (`prefill_pass`): the head's shifted pass over the chunk, row p
  fed (h_p, token p+1), the last prompt row fed the first sampled token, which drafts d1..dk.

Drafts are the head's argmax (lowest id on ties), so the draft distribution q is one-hot. Results
come back per row as [n committed, a accepted, tokens...]. The penalty counts on the device are
read, never written here: the scheduler adds committed tokens (`StepPlan.count_tokens`).
NOTE: eager only; the whole round inside CUDA graphs per (batch bucket, k) is not built yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ninfer.engine import acceptance
from ninfer.kernels.sampling.reference import FREQUENCY, PRESENCE, RowParams
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.mtp import MtpHead
from ninfer.model.qwen3_5 import Qwen3_5Model

HEADER = 2  # result columns before the tokens: number committed, number of drafts accepted


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
    ) -> None:
        """`counts`: the decode step's per-slot penalty counts (read for penalties only)."""
        self.model = model
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

    @property
    def result_width(self) -> int:
        return HEADER + self.k + 1

    # -- decode rows ---------------------------------------------------------------------------
    def run(self, rows: Sequence[SpecInput]) -> torch.Tensor:
        """Rounds and fallback steps; returns [B, HEADER + k + 1] int64 on the device, in row
        order: (n, a, the n committed tokens, padding)."""
        out = torch.zeros((len(rows), self.result_width), dtype=torch.int64, device=self.device)
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(rows):
            groups.setdefault(r.num_drafts, []).append(i)
        for num_drafts, index in groups.items():
            picked = [rows[i] for i in index]
            result = self._round(picked) if num_drafts else self._fallback(picked)
            out.index_copy_(0, torch.tensor(index, device=self.device), result)
        return out

    def _round(self, rows: Sequence[SpecInput]) -> torch.Tensor:
        k, width = self.k, self.k + 1
        num = len(rows)
        assert all(r.num_drafts == k for r in rows)
        slots = self._ints([r.slot for r in rows])
        t0 = self._ints([r.token for r in rows])
        ids = torch.cat((t0[:, None], self.drafts.index_select(0, slots)), dim=1)  # [B, W]
        batch = self._batch(rows, ids, width, verify=True)
        hidden = self.model.forward_hidden(batch, self.cache)  # [B * W, H]
        logits = self.model.compute_logits(hidden).view(num, width, -1)
        params = self._params(rows)
        counts, count_rows = self._penalty_counts(rows, slots)
        committed, accepted = acceptance.verify(
            logits,
            ids[:, 1:],
            params,
            num_sampleable=self.num_sampleable,
            counts=counts,
            count_rows=count_rows,
        )
        self._record(batch.verify_states or [], [r.slot for r in rows])
        # the head's shifted pass over the verify: row j sees (h_j, d_{j+1}); row a (h_a, t*)
        every = torch.arange(num, device=self.device)
        next_ids = torch.cat((ids[:, 1:], ids[:, :1]), dim=1)
        next_ids[every, accepted] = committed[every, accepted]
        head_batch = self._batch(rows, next_ids, width, verify=False)
        head_hidden = self.head.forward_hidden(head_batch, self.cache, hidden).view(num, width, -1)
        last = head_hidden[every, accepted]  # [B, H]
        positions = self._ints([r.position for r in rows]) + accepted
        self._draft(rows, slots, last, positions, horizon=[r.position + k for r in rows])
        return self._result(accepted + 1, accepted, committed)

    def _fallback(self, rows: Sequence[SpecInput]) -> torch.Tensor:
        num = len(rows)
        slots = self._ints([r.slot for r in rows])
        ids = self._ints([r.token for r in rows])[:, None]
        batch = self._batch(rows, ids, 1, verify=False)
        hidden = self.model.forward_hidden(batch, self.cache)  # [B, H]
        logits = self.model.compute_logits(hidden)[:, None]
        counts, count_rows = self._penalty_counts(rows, slots)
        committed, _ = acceptance.verify(
            logits,
            ids[:, :0],
            self._params(rows),
            num_sampleable=self.num_sampleable,
            counts=counts,
            count_rows=count_rows,
        )
        known = self._ints([r.next_token for r in rows])
        next_ids = torch.where(known >= 0, known, committed[:, 0])[:, None]
        head_batch = self._batch(rows, next_ids, 1, verify=False)
        last = self.head.forward_hidden(head_batch, self.cache, hidden)
        positions = self._ints([r.position for r in rows])
        self._draft(rows, slots, last, positions, horizon=[r.position for r in rows])
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
        self._draft([row], self._ints([slot]), out[num - 1 :], self._ints([last]), horizon=[last])

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
        """d1 from the head's output `hidden` (its row at KV index `positions`), then k - 1
        autoregressive head steps at positions + 1.. for the rows whose pages reach that far
        (`horizon`: a host bound on each row's position); the others repeat d1."""
        k = self.k
        d = self._argmax(self.head.compute_logits(hidden))
        drafts = d[:, None].repeat(1, k)
        page_size = self.cache.page_size
        can = [
            i for i, r in enumerate(rows) if horizon[i] + k - 1 < len(r.pages) * page_size and k > 1
        ]
        if can:
            pick = torch.tensor(can, device=self.device)
            sub = [rows[i] for i in can]
            width = max(len(r.pages) for r in sub)
            table = self._table(sub, width)
            h, tok, pos = hidden[pick], d[pick], positions[pick]
            offsets = self._ints([r.rope_offset for r in sub])
            bound = max(horizon[i] for i in can)
            for i in range(1, k):
                step = ForwardBatch(
                    input_ids=tok,
                    positions=pos + i + offsets,
                    cu_seqlens=torch.arange(len(sub) + 1, dtype=torch.int32, device=self.device),
                    num_computed=pos + i,
                    page_table=table,
                    state_slots=slots[pick],
                    query_lens=(1,) * len(sub),
                    max_kv_len=min(bound + i + 1, width * page_size),
                )
                h = self.head.forward_hidden(step, self.cache, h)
                tok = self._argmax(self.head.compute_logits(h))
                drafts[pick, i] = tok
        self.drafts.index_copy_(0, slots, drafts)

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

    def _penalty_counts(
        self, rows: Sequence[SpecInput], slots: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if any(r.reals[PRESENCE] or r.reals[FREQUENCY] for r in rows):
            return self.counts, slots
        return None, None

    def _argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's proposal: argmax over sampleable ids (torch returns the lowest on ties)."""
        return logits[:, : self.num_sampleable].argmax(dim=-1)

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
