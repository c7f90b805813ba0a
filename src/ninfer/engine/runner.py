"""The model runner: executes a StepPlan on the model and returns pending sampled tokens.

It turns plain scheduler data into ForwardBatches, runs the model (a prefill chunk, then the
compact decode batch) and samples. Its result is *pending*: the engine's output side decides what
to commit. The runner owns the device-side cache; it never decides policy.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ninfer.engine.graphs import DecodeGraphs, GraphError
from ninfer.engine.media_join import TowerCache, chunk_inputs, encode_media
from ninfer.engine.penalty_counts import PenaltyCounts
from ninfer.engine.sampling import Sampler
from ninfer.engine.scheduler import Sequence, StepPlan
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.qwen3_5 import Qwen3_5Model
from ninfer.model.vision import VisionTower

log = logging.getLogger("ninfer.engine")


@dataclass(frozen=True)
class StepResult:
    """Sampled token per sequence that produced one this step (prefill final chunk or decode)."""

    sampled: dict[int, int]  # id(Sequence) -> token id


class ModelRunner:
    def __init__(
        self,
        model: Qwen3_5Model,
        cache: ModelCache,
        sampler: Sampler,
        device: torch.device | str = "cpu",
        graphs: DecodeGraphs | None = None,
        vision: VisionTower | None = None,
        tower_cache_bytes: int = 256 << 20,
    ) -> None:
        self.model = model
        self.cache = cache
        self.sampler = sampler
        self.device = torch.device(device)
        self.graphs = graphs  # CUDA-graph decode (engine/graphs.py); None: eager
        self.penalty_counts: PenaltyCounts | None = None  # made at the first penalised step
        self.vision = vision  # [vision] None: media requests are refused before submit
        self.tower_cache = TowerCache(tower_cache_bytes) if vision is not None else None

    def execute(self, plan: StepPlan) -> StepResult:
        sampled: dict[int, int] = {}
        rows: list[tuple[Sequence, torch.Tensor]] = []
        if plan.prefill is not None:
            unit = plan.prefill
            seq = unit.seq
            assert seq.slot is not None
            if unit.start == 0:
                self.cache.reset_slot(seq.slot)
            ids = seq.token_ids[unit.start : unit.start + unit.num_tokens]
            if seq.request.media is None:
                batch = ForwardBatch.prefill(
                    ids,
                    num_computed=unit.start,
                    page_ids=seq.pages,
                    state_slot=seq.slot,
                    device=self.device,
                )
            else:
                batch = self._media_chunk(seq, unit.start, ids)
            logits = self.model.forward(batch, self.cache)  # [1, V]
            if seq.media is not None and unit.start + unit.num_tokens >= seq.num_prompt:
                seq.media = None  # [vision] the last chunk read the tower output: free it
            if unit.samples:
                rows.append((seq, logits[0]))
        if plan.decode:
            seqs = plan.decode
            ids = [s.token_ids[s.num_computed] for s in seqs]
            num_computed = [s.num_computed for s in seqs]
            page_tables = [s.pages for s in seqs]
            slots: list[int] = [s.slot for s in seqs]  # type: ignore[misc]
            # [vision] a media prompt's decode positions run at KV index + rope delta
            offsets = [s.request.media.rope_delta if s.request.media else 0 for s in seqs]
            position_offsets = offsets if any(offsets) else None
            logits = None
            if self.graphs is not None and self.graphs.fits(
                len(seqs), max(len(p) for p in page_tables)
            ):
                try:
                    logits = self.graphs.decode(
                        ids,
                        num_computed=num_computed,
                        page_tables=page_tables,
                        state_slots=slots,
                        position_offsets=position_offsets,
                    )  # [B, V], static: sampled below before the next replay
                except GraphError as e:  # capture touched only the dummy slot: go eager
                    log.warning("CUDA graphs disabled, decoding eagerly: %s", e)
                    self.graphs = None
            if logits is None:
                batch = ForwardBatch.decode(
                    ids,
                    num_computed=num_computed,
                    page_tables=page_tables,
                    state_slots=slots,
                    device=self.device,
                    position_offsets=position_offsets,
                )
                logits = self.model.forward(batch, self.cache)  # [B, V]
            rows.extend((s, logits[i]) for i, s in enumerate(seqs))
        if rows:
            seqs = [s for s, _ in rows]
            if plan.decode and len(rows) == len(plan.decode):
                stacked = logits  # decode rows only: sample the [B, V] logits in place
            else:
                stacked = torch.stack([row for _, row in rows])
            params = [s.sampling for s in seqs]
            counts = count_rows = None
            if any(p.presence_penalty or p.frequency_penalty for p in params):
                counts, count_rows = self._output_counts(seqs, stacked)
            steps = [s.num_output for s in seqs]
            tokens = self.sampler.sample(stacked, params, steps, counts, count_rows)
            for s, t in zip(seqs, tokens.tolist(), strict=True):
                sampled[id(s)] = int(t)
        return StepResult(sampled)

    def _media_chunk(self, seq: Sequence, start: int, ids: list[int]) -> ForwardBatch:
        """[vision] A prefill chunk of a media prompt: the tower runs once, before the first
        chunk (or again if the request restarts its prompt); chunks take MRoPE positions and
        the media rows that fall inside them."""
        media = seq.request.media
        assert media is not None and seq.slot is not None
        if self.vision is None:
            raise RuntimeError("a media request reached an engine without a vision tower")
        if seq.media is None or start == 0:
            seq.media = encode_media(self.vision, media, self.tower_cache)
        positions, embed_index, embed_rows = chunk_inputs(seq.media, start, len(ids))
        return ForwardBatch.prefill(
            ids,
            num_computed=start,
            page_ids=seq.pages,
            state_slot=seq.slot,
            device=self.device,
            positions=positions,
            embed_index=embed_index,
            embed_rows=embed_rows,
        )

    def _output_counts(
        self, seqs: list[Sequence], logits: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Generated-token counts of each row: the per-slot buffer, updated in place, and the
        row -> slot map the sampler reads it through."""
        if self.penalty_counts is None:
            self.penalty_counts = PenaltyCounts(
                self.cache.num_slots, logits.shape[1], logits.device
            )
        return self.penalty_counts.counts, self.penalty_counts.rows_for(seqs)
