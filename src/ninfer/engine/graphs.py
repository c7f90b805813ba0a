"""CUDA graphs of the decode step: one per (batch size, page-table width) over static buffers.

Imports torch and model/ only. A graph bakes in every tensor address and host-side shape, so the
step's inputs live in one preallocated device buffer (token, position, slot and page table per
row), refreshed by a single host-to-device copy before each replay. Batch sizes are exact (no
padding rows); page tables are padded to a power-of-two width bucket, because the attention work
of the reference path grows with the width, not with the real context. Capture and warm-up run
on a reserved dummy state slot and KV page, so they never touch a live sequence's state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.layers.moe import GATHER_MAX_ASSIGNMENTS
from ninfer.model.qwen3_5 import Qwen3_5Model

log = logging.getLogger("ninfer.engine.graphs")

OnCapture = Callable[[int, int, float], None]  # (batch rows, page-table width, seconds)

# Columns of the staging buffer before the page table.
_IDS, _POS, _SLOT, _PAGES = 0, 1, 2, 3


class GraphError(RuntimeError):
    """CUDA graphs cannot serve this model or this batch."""


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    logits: torch.Tensor  # [b, V] fp32, overwritten by every replay


def unsupported_reason(model: Qwen3_5Model, max_batch: int = 1) -> str | None:
    """Why decode steps of up to `max_batch` rows cannot be captured, or None when they can."""
    if model.device.type != "cuda":
        return f"the model is on {model.device}, not a CUDA device"
    num_assignments = model.config.num_experts_per_tok * max_batch
    if model.config.is_moe and num_assignments > GATHER_MAX_ASSIGNMENTS:
        # NOTE: above this the MoE layer groups tokens by expert with host-side counts, a
        # device-to-host sync that stream capture forbids (model/layers/moe.py).
        return f"{num_assignments} MoE expert assignments per step take a host-synced path"
    return None


class DecodeGraphs:
    """Captured decode steps of one model and cache, replayed for batches of 1..max_batch rows."""

    def __init__(
        self,
        model: Qwen3_5Model,
        cache: ModelCache,
        *,
        max_batch: int,
        max_pages: int,
        dummy_slot: int,
        dummy_page: int,
        on_capture: OnCapture | None = None,
    ) -> None:
        """`on_capture` hears of each capture as it finishes (on the engine's worker thread):
        graphs are captured on first use, so a first request at a new shape waits for one."""
        reason = unsupported_reason(model, max_batch)
        if reason is not None:
            raise GraphError(f"CUDA graphs are unavailable: {reason}")
        if not 0 <= dummy_slot < cache.num_slots or not 0 <= dummy_page < max(cache.num_pages, 1):
            raise GraphError(f"dummy slot {dummy_slot} / page {dummy_page} outside the cache")
        self.model = model
        self.cache = cache
        self.max_batch = max_batch
        self.max_pages = max(1, max_pages)
        self.dummy_slot = dummy_slot
        self.dummy_page = dummy_page
        self.on_capture = on_capture
        self.device = model.device
        width = _PAGES + self.max_pages
        # [max_batch, 3 + max_pages] int64: id, position (= tokens already computed), slot, pages
        self._host = torch.zeros((max_batch, width), dtype=torch.int64, pin_memory=True)
        self._static = torch.zeros((max_batch, width), dtype=torch.int64, device=self.device)
        self._cu_seqlens = torch.arange(max_batch + 1, dtype=torch.int32, device=self.device)
        self._graphs: dict[tuple[int, int], _Captured] = {}
        self._pool = torch.cuda.graph_pool_handle()

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

    def fits(self, num_seqs: int, num_pages: int) -> bool:
        return 0 < num_seqs <= self.max_batch and 0 < num_pages <= self.max_pages

    def capture(self, num_seqs: int, num_pages: int) -> None:
        """Capture the graph that would serve this batch now (warm-up before timing or serving)."""
        self._get(num_seqs, self.width_for(num_pages))

    def decode(
        self,
        input_ids: Sequence[int],
        *,
        num_computed: Sequence[int],
        page_tables: Sequence[Sequence[int]],
        state_slots: Sequence[int],
    ) -> torch.Tensor:
        """Run one decode step by graph replay; same inputs and result as ForwardBatch.decode.

        Returns:
            [B, vocab] fp32 logits in a static buffer that the next replay overwrites: consume
            (sample) them before the next call.
        """
        num_seqs = len(input_ids)
        if not len(num_computed) == len(page_tables) == len(state_slots) == num_seqs:
            raise GraphError("decode needs one position, page table and state slot per token")
        need = max(len(p) for p in page_tables)
        if not self.fits(num_seqs, need):
            raise GraphError(f"batch of {num_seqs} rows x {need} pages does not fit the graphs")
        captured = self._get(num_seqs, self.width_for(need))
        host = self._host[:num_seqs]
        for row, (token, pos, slot, pages) in enumerate(
            zip(input_ids, num_computed, state_slots, page_tables, strict=True)
        ):
            host[row, _IDS] = int(token)
            host[row, _POS] = int(pos)
            host[row, _SLOT] = int(slot)
            host[row, _PAGES : _PAGES + len(pages)] = torch.as_tensor(pages, dtype=torch.int64)
            host[row, _PAGES + len(pages) :] = pages[0]  # padding columns: masked by kv_lens
        # NOTE: non_blocking from pinned memory; the host rows are rewritten only after the caller
        # has read the logits of this step, which waits for this copy.
        self._static[:num_seqs].copy_(host, non_blocking=True)
        captured.graph.replay()
        return captured.logits

    # -- capture -------------------------------------------------------------------------------
    def _batch(self, num_seqs: int, width: int) -> ForwardBatch:
        rows = self._static[:num_seqs]
        return ForwardBatch(
            input_ids=rows[:, _IDS],
            positions=rows[:, _POS],
            cu_seqlens=self._cu_seqlens[: num_seqs + 1],
            num_computed=rows[:, _POS],
            page_table=rows[:, _PAGES : _PAGES + width],
            state_slots=rows[:, _SLOT],
            query_lens=(1,) * num_seqs,
            max_kv_len=width * self.cache.page_size,
        )

    def _get(self, num_seqs: int, width: int) -> _Captured:
        key = (num_seqs, width)
        captured = self._graphs.get(key)
        if captured is None:
            captured = self._capture(num_seqs, width)
            self._graphs[key] = captured
        return captured

    def _capture(self, num_seqs: int, width: int) -> _Captured:
        rows = self._static[:num_seqs]
        rows.zero_()
        rows[:, _SLOT] = self.dummy_slot
        rows[:, _PAGES:] = self.dummy_page
        batch = self._batch(num_seqs, width)
        started = time.monotonic()
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):  # warm-up: handles, kernel compilation, allocator pools
            self.model.forward(batch, self.cache)
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool):
                logits = self.model.forward(batch, self.cache)
        except RuntimeError as e:  # e.g. an op that syncs with the host during capture
            raise GraphError(f"capturing batch {num_seqs} x {width} pages failed: {e}") from e
        log.debug("captured decode graph: batch %d, %d pages wide", num_seqs, width)
        if self.on_capture is not None:
            self.on_capture(num_seqs, width, time.monotonic() - started)
        return _Captured(graph, logits)
