"""The decode step: forward, sampling and the feed of the next step, over static buffers.

Imports torch, model/ and kernels/ only. One step of B decode rows reads its inputs from static
device buffers (token override, position, state slot, penalty mask, sampler fields, page table),
filled by one host-to-device copy per step; the token a row feeds is either given by the host or
taken on the device from `last_token[slot]`, the sample the previous step wrote there, so the
host never waits for a sample before launching the next step. Sampling (penalties from the
per-slot `counts`, temperature, top-k/p, min-p, seeded Philox race) runs inside the step, which
then updates `last_token` and `counts`. On CUDA the whole step is replayed as a CUDA graph per
(batch bucket, page-table width bucket); padded rows use a reserved dummy slot and page, so they
read and write no live state. Elsewhere the same body runs eagerly at the exact batch size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ninfer.kernels import dispatch
from ninfer.kernels.sampling.reference import RowParams
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.layers.moe import ExpertPath, MoeWeights, decode_path
from ninfer.model.qwen3_5 import Qwen3_5Model

log = logging.getLogger("ninfer.engine.graphs")

OnCapture = Callable[[int, int, float], None]  # (batch rows, page-table width, seconds)

# Batch buckets: a step of B rows replays the graph of the smallest bucket >= B.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64)

# Integer columns of the staging buffer, before the page table. _POS is the KV index, _ROPE the
# RoPE position: the KV index plus a media prompt's rope delta (equal to it for text).
_TOKEN, _POS, _ROPE, _SLOT, _COUNT, _TOPK, _GREEDY, _SEED, _STEP, _PAGES = range(10)
_NUM_REALS = 5  # temperature, top_p, min_p, presence, frequency


class GraphError(RuntimeError):
    """CUDA graphs cannot serve this model or this batch."""


@dataclass(frozen=True)
class DecodeInput:
    """One decode row: `token` < 0 means "the sample last written for this slot"; the token sits
    at KV index `position` and RoPE position `position + rope_offset` (a media prompt's delta)."""

    token: int
    position: int
    slot: int
    pages: Sequence[int]
    rope_offset: int = 0
    reals: tuple[float, float, float, float, float] = (1.0, 1.0, 0.0, 0.0, 0.0)
    ints: tuple[int, int, int, int] = (1, 1, 0, 0)  # top_k, greedy, seed, step
    count: bool = True  # add the sample to the slot's penalty counts


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    sampled: torch.Tensor  # [bucket] int64, overwritten by every replay
    logits: torch.Tensor  # [bucket, V] fp32


def bucket_for(num_rows: int, max_batch: int) -> int:
    """The graph batch size serving `num_rows` rows (max_batch is always a bucket)."""
    return next(b for b in buckets_up_to(max_batch) if b >= num_rows)


def buckets_up_to(max_batch: int) -> tuple[int, ...]:
    """Every batch size a graph is captured for, with max_batch itself as the last bucket."""
    return tuple(sorted({b for b in BATCH_BUCKETS if b < max_batch} | {max_batch}))


def unsupported_reason(model: Qwen3_5Model, max_batch: int = 1) -> str | None:
    """Why decode steps of up to `max_batch` rows cannot be captured, or None when they can."""
    if model.device.type != "cuda":
        return f"the model is on {model.device}, not a CUDA device"
    moe = next((layer.ffn for layer in model.layers if isinstance(layer.ffn, MoeWeights)), None)
    if moe is not None:
        num = model.config.num_experts_per_tok * max_batch
        if decode_path(moe, model.dtype, num) is ExpertPath.LOOP:
            # NOTE: the loop path sizes its GEMMs from host-side counts, a device-to-host sync
            # that stream capture forbids (model/layers/moe.py).
            return f"{num} MoE expert assignments per step take a host-synced path"
    return None


class DecodeStep:
    """Decode steps of one model and cache: B rows in, B sampled ids out (on the device).

    `last_token[s]` holds the latest sample of state slot s and `counts[s, id]` the penalty
    counts of s's generated tokens; both have one row per cache slot.
    """

    def __init__(
        self,
        model: Qwen3_5Model,
        cache: ModelCache,
        *,
        max_batch: int,
        max_pages: int,
        num_sampleable: int,
        use_graphs: bool,
        dummy_slot: int | None = None,
        dummy_page: int | None = None,
        on_capture: OnCapture | None = None,
    ) -> None:
        """`on_capture` hears of each capture as it finishes (on the engine's worker thread):
        graphs are captured on first use, so a first step at a new shape waits for one."""
        self.model = model
        self.on_capture = on_capture
        self.cache = cache
        self.device = model.device
        self.max_batch = max_batch
        self.max_pages = max(1, max_pages)
        self.num_sampleable = num_sampleable
        if use_graphs:
            reason = unsupported_reason(model, max_batch)
            if reason is not None:
                raise GraphError(f"CUDA graphs are unavailable: {reason}")
            if dummy_slot is None or dummy_page is None:
                raise GraphError("CUDA graphs need a reserved dummy slot and page")
            if not 0 <= dummy_slot < cache.num_slots or not 0 <= dummy_page < cache.num_pages:
                raise GraphError(f"dummy slot {dummy_slot} / page {dummy_page} outside the cache")
        self.use_graphs = use_graphs
        self.dummy_slot = dummy_slot
        self.dummy_page = dummy_page
        width = _PAGES + self.max_pages
        pin = self.device.type == "cuda"
        # two host staging buffers, alternated: one may still be copying while the next fills
        self._host_ints = [
            torch.zeros((max_batch, width), dtype=torch.int64, pin_memory=pin) for _ in range(2)
        ]
        self._host_reals = [
            torch.zeros((max_batch, _NUM_REALS), dtype=torch.float64, pin_memory=pin)
            for _ in range(2)
        ]
        self._turn = 0
        self._ints = torch.zeros((max_batch, width), dtype=torch.int64, device=self.device)
        self._reals = torch.zeros((max_batch, _NUM_REALS), dtype=torch.float64, device=self.device)
        self._cu_seqlens = torch.arange(max_batch + 1, dtype=torch.int32, device=self.device)
        self.last_token = torch.zeros(cache.num_slots, dtype=torch.int64, device=self.device)
        self.counts = torch.zeros(
            (cache.num_slots, num_sampleable), dtype=torch.int32, device=self.device
        )
        self._graphs: dict[tuple[int, int], _Captured] = {}
        self._pool = torch.cuda.graph_pool_handle() if use_graphs else None

    @property
    def num_captured(self) -> int:
        return len(self._graphs)

    def width_for(self, num_pages: int) -> int:
        """The page-table width bucket for rows of up to `num_pages` pages."""
        if not 0 < num_pages <= self.max_pages:
            raise GraphError(f"{num_pages} pages do not fit the graph width {self.max_pages}")
        width = 1
        while width < num_pages:
            width *= 2
        return min(width, self.max_pages)

    def capture(self, num_rows: int, num_pages: int) -> None:
        """Capture the graph that would serve this batch now (warm-up before timing or serving)."""
        if self.use_graphs:
            self._get(bucket_for(num_rows, self.max_batch), self.width_for(num_pages))

    # -- per-slot state the host adjusts ---------------------------------------------------------
    def reset_counts(self, slot: int) -> None:
        self.counts[slot].zero_()

    def adjust_counts(self, uncount_slots: Sequence[int], add: Sequence[tuple[int, int]]) -> None:
        """Remove each slot's latest sample from its counts; add the given (slot, id) pairs."""
        if uncount_slots:
            slots = torch.tensor(list(uncount_slots), dtype=torch.int64).to(self.device)
            ones = torch.full((len(uncount_slots),), -1, dtype=torch.int32, device=self.device)
            self.counts.index_put_((slots, self.last_token[slots]), ones, accumulate=True)
        if add:
            # flat (slot, id) indices into one index_add_: one transfer and one kernel, where
            # index_put_ with accumulate sorts first (a speculative engine adds every round)
            width = self.counts.shape[1]
            flat = torch.tensor([s * width + t for s, t in add], dtype=torch.int64)
            index = flat.to(self.device, non_blocking=True)
            ones = torch.ones(len(add), dtype=torch.int32, device=self.device)
            self.counts.view(-1).index_add_(0, index, ones)

    def record_samples(
        self, slots: torch.Tensor, sampled: torch.Tensor, mask: torch.Tensor | None = None
    ) -> None:
        """Make `sampled[i]` the next feed of `slots[i]` and add it to that slot's counts
        (where `mask[i]` is 1; all when None). Used inside the step and for prefill samples."""
        self.last_token.index_copy_(0, slots, sampled)
        if mask is None:
            mask = torch.ones(slots.shape[0], dtype=torch.int32, device=self.device)
        self.counts.index_put_((slots, sampled), mask, accumulate=True)

    # -- the step --------------------------------------------------------------------------------
    def run(self, rows: Sequence[DecodeInput]) -> torch.Tensor:
        """Launch one decode step; returns [B] int64 samples on the device (a view of a static
        buffer on the graph path: read or copy it before the next call)."""
        num_rows = len(rows)
        if not 0 < num_rows <= self.max_batch:
            raise GraphError(f"{num_rows} rows do not fit max_batch {self.max_batch}")
        need = max(len(r.pages) for r in rows)
        width = self.width_for(need)
        size = bucket_for(num_rows, self.max_batch) if self.use_graphs else num_rows
        self._stage(rows, size, width)
        if self.use_graphs:
            try:
                captured = self._get(size, width)
            except GraphError as e:  # capture touched only the dummy slot: go eager for good
                log.warning("CUDA graphs disabled, decoding eagerly: %s", e)
                self.use_graphs = False
                return self.run(rows)
            captured.graph.replay()
            return captured.sampled[:num_rows]
        sampled, _ = self._body(size, width)
        return sampled

    def logits_of_last_step(self, num_rows: int, num_pages: int) -> torch.Tensor:
        """The graph path's logits of the latest step (tests compare them with eager forwards)."""
        size = bucket_for(num_rows, self.max_batch)
        return self._graphs[(size, self.width_for(num_pages))].logits[:num_rows]

    def _stage(self, rows: Sequence[DecodeInput], size: int, width: int) -> None:
        ints = self._host_ints[self._turn]
        reals = self._host_reals[self._turn]
        self._turn ^= 1
        num_rows, cols = len(rows), _PAGES + width
        # one tensor built from Python lists: far cheaper than per-element tensor writes
        table = [
            [r.token, r.position, r.position + r.rope_offset, r.slot, int(r.count), *r.ints]
            + list(r.pages)
            + [r.pages[0]] * (width - len(r.pages))  # padding columns: masked by kv_lens
            for r in rows
        ]
        ints[:num_rows, :cols] = torch.tensor(table, dtype=torch.int64)
        reals[:num_rows] = torch.tensor([r.reals for r in rows], dtype=torch.float64)
        if size > len(rows):  # padding rows: the dummy slot and page, greedy, uncounted
            pad = ints[len(rows) : size]
            pad.zero_()
            pad[:, _SLOT] = self.dummy_slot
            pad[:, _PAGES : _PAGES + width] = self.dummy_page
            pad[:, _TOPK] = 1
            pad[:, _GREEDY] = 1
            reals[len(rows) : size] = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
        # NOTE: non_blocking from pinned memory; this host buffer is refilled two steps later,
        # after the engine has waited for the step that copied it.
        self._ints[:size, : _PAGES + width].copy_(ints[:size, : _PAGES + width], non_blocking=True)
        self._reals[:size].copy_(reals[:size], non_blocking=True)

    def _body(self, size: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward + sample + feed bookkeeping for the first `size` staged rows."""
        rows = self._ints[:size]
        slots = rows[:, _SLOT]
        override = rows[:, _TOKEN]
        ids = torch.where(override >= 0, override, self.last_token.index_select(0, slots))
        batch = ForwardBatch(
            input_ids=ids,
            positions=rows[:, _ROPE],
            cu_seqlens=self._cu_seqlens[: size + 1],
            num_computed=rows[:, _POS],
            page_table=rows[:, _PAGES : _PAGES + width],
            state_slots=slots,
            query_lens=(1,) * size,
            max_kv_len=width * self.cache.page_size,
        )
        logits = self.model.forward(batch, self.cache)  # [size, V] fp32
        params = RowParams(self._reals[:size], rows[:, _TOPK : _STEP + 1])
        sampled = dispatch.sample_tokens(
            logits,
            params,
            num_sampleable=self.num_sampleable,
            counts=self.counts,
            count_rows=slots,
        )
        self.record_samples(slots, sampled, rows[:, _COUNT].to(torch.int32))
        return sampled, logits

    # -- capture ---------------------------------------------------------------------------------
    def _get(self, size: int, width: int) -> _Captured:
        key = (size, width)
        captured = self._graphs.get(key)
        if captured is None:
            started = time.monotonic()
            captured = self._capture(size, width)
            self._graphs[key] = captured
            if self.on_capture is not None:
                self.on_capture(size, width, time.monotonic() - started)
        return captured

    def _capture(self, size: int, width: int) -> _Captured:
        # Capture on padding-only inputs: the dummy slot and page, no counting. The live rows
        # staged for this step (if any) are restored afterwards from the host buffer.
        saved_ints = self._ints[:size].clone()
        saved_reals = self._reals[:size].clone()
        saved_token = self.last_token[self.dummy_slot].clone()
        rows = self._ints[:size]
        rows.zero_()
        rows[:, _SLOT] = self.dummy_slot
        rows[:, _PAGES:] = self.dummy_page
        rows[:, _TOPK] = 1
        rows[:, _GREEDY] = 1
        self._reals[:size] = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):  # warm-up: handles, kernel compilation, allocator pools
            self._body(size, width)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                sampled, logits = self._body(size, width)
        except RuntimeError as e:  # e.g. an op that syncs with the host during capture
            raise GraphError(f"capturing batch {size} x {width} pages failed: {e}") from e
        self._ints[:size].copy_(saved_ints)
        self._reals[:size].copy_(saved_reals)
        self.last_token[self.dummy_slot] = saved_token
        log.debug("captured decode graph: batch %d, %d pages wide", size, width)
        return _Captured(graph, sampled, logits)
