"""The model runner: launches a StepPlan on the device and hands back its samples later.

It turns plan rows into the decode step's inputs (`engine/graphs.py`: forward, sampling and the
next step's feed inside one CUDA graph) and into prefill forwards, one per chunk (each chunk keeps
the fast single-sequence attention path; a mixed step therefore computes exactly what separate
steps compute). `launch` only enqueues device work: the sampled ids travel to pinned host memory
behind an event, and `wait()` on the returned handle reads them. The plan's copies (StateImage
captures and restores, KV page copies, host transfers) run first, in order (`engine/copies.py`);
a row with checkpoints captures its slot's state into an image slot right after its forward.
The runner owns the device-side cache and never decides policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ninfer.engine.copies import CopyEngine
from ninfer.engine.graphs import DecodeInput, DecodeStep
from ninfer.engine.media_join import TowerCache, chunk_inputs, encode_media
from ninfer.engine.plan import (
    FROM_DEVICE,
    ROUND_STOP_IDS,
    Row,
    StepOutcome,
    StepPlan,
    outcome_of,
)
from ninfer.engine.sampling import Sampler, row_fields
from ninfer.engine.spec_step import HEADER, SpecInput, SpecStep
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.qwen3_5 import Qwen3_5Model
from ninfer.model.vision import VisionTower


@dataclass
class _InFlight:
    """A launched step: its samples land in `host` once `event` has completed."""

    plan: StepPlan
    host: torch.Tensor  # [>= n] int64, pinned on CUDA
    num_samples: int
    event: torch.cuda.Event | None
    spec_width: int = 0  # speculative decode rows: each lands as spec_width values first

    def wait(self) -> StepOutcome:
        if self.event is not None:
            self.event.synchronize()
        values = self.host[: self.num_samples].tolist()
        if not self.spec_width:
            return outcome_of(self.plan, values)
        w, num = self.spec_width, len(self.plan.decode)
        results = [values[i * w : (i + 1) * w] for i in range(num)]
        committed = tuple(tuple(r[HEADER : HEADER + r[0]]) for r in results)
        rest = outcome_of(StepPlan(prefill=self.plan.prefill), values[num * w :])
        return StepOutcome(
            tuple(c[0] for c in committed) + rest.sampled,
            committed + (None,) * len(self.plan.prefill),
            tuple(r[1] for r in results) + (0,) * len(self.plan.prefill),
        )


class ModelRunner:
    def __init__(
        self,
        model: Qwen3_5Model,
        cache: ModelCache,
        decode: DecodeStep,
        *,
        vision: VisionTower | None = None,
        tower_cache_bytes: int = 256 << 20,
        spec: SpecStep | None = None,
    ) -> None:
        """`spec`: the MTP round step of a speculative engine (every decode row goes through it
        and every prefill chunk also runs the head's shifted pass)."""
        self.model = model
        self.spec = spec
        self.cache = cache
        self.decode = decode
        self.sampler = Sampler(decode.num_sampleable)  # a prompt's first token, outside the step
        self.vision = vision  # [vision] None: media requests are refused before submit
        self.tower_cache = TowerCache(tower_cache_bytes) if vision is not None else None
        self.device = model.device
        cuda = self.device.type == "cuda"
        size = decode.max_batch * (1 + (spec.result_width if spec is not None else 0))
        # two pinned result buffers, alternated like the decode step's staging buffers
        self._host = [torch.zeros(size, dtype=torch.int64, pin_memory=cuda) for _ in range(2)]
        self._turn = 0
        self.copies = CopyEngine(cache, self.device)

    def launch(self, plan: StepPlan) -> _InFlight:
        """Enqueue the step; nothing here waits for the device."""
        self.copies.run(plan.copies, plan.free_host)
        # corrections for earlier occupants first: a slot may change hands within this plan
        self.decode.adjust_counts(plan.uncount_slots, plan.count_tokens)
        for row in plan.rows:
            if row.first:  # a new residency: counts start empty
                self.decode.reset_counts(row.slot)
                if row.fresh:
                    self.cache.reset_slot(row.slot)
        for slot, ids in plan.recount:  # a sequence resumed after a pause
            self.decode.reset_counts(slot)
            self.decode.adjust_counts((), [(slot, t) for t in ids])
        samples: list[torch.Tensor] = []
        spec_width = 0
        if plan.decode and self.spec is not None:
            samples.append(self.spec.run([_spec_input(r) for r in plan.decode]).reshape(-1))
            spec_width = self.spec.result_width
        elif plan.decode:
            samples.append(self.decode.run([_decode_input(r) for r in plan.decode]))
        for row in plan.prefill:
            sample = self._prefill(row)
            if sample is not None:
                samples.append(sample)
        host = self._host[self._turn]
        self._turn ^= 1
        num = 0
        event = None
        if samples:
            flat = samples[0] if len(samples) == 1 else torch.cat(samples)
            num = flat.shape[0]
            host[:num].copy_(flat, non_blocking=True)
            if self.device.type == "cuda":
                event = torch.cuda.Event()
                event.record()
        return _InFlight(plan, host, num, event, spec_width)

    def _prefill(self, row: Row) -> torch.Tensor | None:
        seq = row.seq
        if seq.request.media is None:
            batch = ForwardBatch.prefill(
                row.token_ids,
                num_computed=row.start,
                page_ids=row.pages,
                state_slot=row.slot,
                device=self.device,
            )
        else:
            batch = self._media_chunk(row)
        if seq.media is not None and row.start + row.num_new_tokens >= seq.num_prompt:
            seq.media = None  # [vision] the last chunk is enqueued with the tower output
        if self.spec is not None:
            return self._spec_prefill(row, batch)
        if not row.samples:
            self.model.forward_hidden(batch, self.cache)
            self._capture(row)
            return None
        logits = self.model.forward(batch, self.cache)  # [1, V]
        self._capture(row)
        return self._sample_first(row, logits)

    def _sample_first(self, row: Row, logits: torch.Tensor) -> torch.Tensor:
        slots = torch.tensor([row.slot], dtype=torch.int64).to(self.device)
        token = self.sampler.sample(
            logits, [row.seq.sampling], [row.sample_index], self.decode.counts, slots
        )  # [1]
        self.decode.record_samples(slots, token)
        return token

    def _spec_prefill(self, row: Row, batch: ForwardBatch) -> torch.Tensor | None:
        """A chunk of a speculative engine: the target, its sample if it ends the prompt, then
        the MTP head's shifted pass over the chunk (the prompt's last row fed the sample)."""
        assert self.spec is not None
        hidden = self.model.forward_hidden(batch, self.cache)
        self._capture(row)
        token = None
        if row.samples:
            token = self._sample_first(row, self.model.compute_logits(hidden[-1:]))
        end = row.start + row.num_new_tokens
        known = row.seq.token_ids[row.start + 1 : end + 1]  # the next token of each row, if known
        last = token if token is not None and len(known) < row.num_new_tokens else None
        media = row.seq.request.media
        self.spec.prefill_pass(
            batch,
            hidden,
            known,
            last,
            start=row.start,
            pages=row.pages,
            slot=row.slot,
            rope_offset=media.rope_delta if media is not None else 0,
        )
        return token

    def _media_chunk(self, row: Row) -> ForwardBatch:
        """[vision] A prefill chunk of a media prompt: the tower runs once, before the first
        chunk computed (or again if the request restarts its prompt), over the media that lies
        at or after that chunk; chunks take MRoPE positions and the media rows that fall inside
        them."""
        seq = row.seq
        if self.vision is None:
            raise RuntimeError("a media request reached an engine without a vision tower")
        if seq.media is None or row.start == 0:
            # media wholly before this chunk (inside a reused prefix, or an earlier residency's
            # prompt when a replay rebuilds its output only) never reaches the tower
            seq.media = encode_media(
                self.vision, seq.request.media, self.tower_cache, start=row.start
            )
        ids = list(row.token_ids)
        positions, embed_index, embed_rows = chunk_inputs(seq.media, row.start, len(ids))
        return ForwardBatch.prefill(
            ids,
            num_computed=row.start,
            page_ids=row.pages,
            state_slot=row.slot,
            device=self.device,
            positions=positions,
            embed_index=embed_index,
            embed_rows=embed_rows,
        )

    def _capture(self, row: Row) -> None:
        # NOTE: the scheduler ends every chunk at its checkpoint, so only the row's end is ever
        # asked for; a capture inside a row would need its forward split there.
        assert all(offset == row.num_new_tokens for offset in row.checkpoint_at)
        self.copies.run(row.after)


def _spec_input(row: Row) -> SpecInput:
    reals, ints = row_fields(row.seq.sampling, row.sample_index)
    seq = row.seq
    after = row.start + 1  # the token after t0, if already known (a control token)
    media = seq.request.media
    return SpecInput(
        token=row.token_ids[0],
        position=row.start,
        slot=row.slot,
        pages=row.pages,
        num_drafts=row.num_drafts,
        reals=reals,
        ints=ints,
        next_token=seq.token_ids[after] if not row.chained and after < len(seq.token_ids) else -1,
        rope_offset=media.rope_delta if media is not None else 0,
        chained=row.chained,
        stop_ids=_round_stops(seq) if row.num_drafts else (),
    )


def _round_stops(seq: Any) -> tuple[int, ...]:
    """The stop ids a round checks on the device (none when there are more than it holds: such
    a request never chains its rounds)."""
    stops = seq.output.stop_token_ids if seq.output is not None else frozenset()
    return tuple(sorted(stops)) if len(stops) <= ROUND_STOP_IDS else ()


def _decode_input(row: Row) -> DecodeInput:
    reals, ints = row_fields(row.seq.sampling, row.sample_index)
    token = row.token_ids[0]
    media = row.seq.request.media
    return DecodeInput(
        token=token if token != FROM_DEVICE else -1,
        position=row.start,
        slot=row.slot,
        pages=row.pages,
        rope_offset=media.rope_delta if media is not None else 0,
        reals=reals,
        ints=ints,
        count=row.count_sample,
    )
