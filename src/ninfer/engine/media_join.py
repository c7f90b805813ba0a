"""Where media meets the engine: encode a request's media once, then feed each prefill chunk.

Imports torch, media.layout and model.vision. The runner calls `encode_media` once per request
before its first prefill chunk (the vision tower runs there, on the worker thread that owns the
device); `chunk_inputs` slices the [3, T] MRoPE positions and the embedding overrides of one chunk,
so media may straddle chunk boundaries. After the prompt, a position is its KV index plus
`rope_delta` (all three axes equal): decode steps, and replay chunks over committed output. A
request that starts from a prefix-cache hit computes only its suffix, so media wholly inside the
reused prefix is never encoded (`TowerCache.prefix_skips` counts it). Text-only requests never
reach this module.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass

import torch

from ninfer.media.layout import MediaPrompt
from ninfer.model.vision import VisionTower


@dataclass(frozen=True, eq=False)
class EncodedMedia:
    """A request's media tokens as text-model input rows, in prompt order."""

    positions: torch.Tensor  # [3, T] int64 on the device
    index: list[int]  # prompt indices of the media tokens, ascending
    rows: torch.Tensor  # [len(index), hidden] on the device
    rope_delta: int

    @property
    def nbytes(self) -> int:
        return self.rows.numel() * self.rows.element_size()


class TowerCache:
    """Tower outputs of recently seen media (keyed by the source digest and modality), LRU
    within `max_bytes` of device memory; a repeated image skips the tower. Worker thread only."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.encoded = 0  # items that went through the tower
        self.prefix_skips = 0  # items inside a reused prefix: neither encoded nor looked up
        self._rows: OrderedDict[tuple[str, str], torch.Tensor] = OrderedDict()

    def get(self, key: tuple[str, str]) -> torch.Tensor | None:
        rows = self._rows.get(key)
        if rows is not None:
            self._rows.move_to_end(key)
            self.hits += 1
        return rows

    def put(self, key: tuple[str, str], rows: torch.Tensor) -> None:
        size = rows.numel() * rows.element_size()
        if size > self.max_bytes or key in self._rows:
            return
        self._rows[key] = rows
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, old = self._rows.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()


def encode_media(
    tower: VisionTower, prompt: MediaPrompt, cache: TowerCache | None = None, start: int = 0
) -> EncodedMedia:
    """Run the vision tower over the items of `prompt` not in `cache` (one call) and place the
    merged tokens at their pad positions. Computation starts at prompt index `start` (after a
    prefix-cache hit): items whose every pad lies before it are skipped altogether."""
    outputs: list[torch.Tensor | None] = [None] * len(prompt.items)
    runs = sorted((r for r in prompt.runs if r.start + r.length > start), key=lambda r: r.start)
    needed = {r.item for r in runs}
    if cache is not None:
        cache.prefix_skips += len(prompt.items) - len(needed)
    todo = []
    for i, item in enumerate(prompt.items):
        if i not in needed:
            continue
        key = (item.digest, item.modality)
        if cache is not None and item.digest and (rows := cache.get(key)) is not None:
            outputs[i] = rows
        else:
            todo.append(i)
    if todo:
        items = [prompt.items[i] for i in todo]
        fresh = tower.encode([m.patches for m in items], [m.grid_thw for m in items])
        for i, rows in zip(todo, fresh, strict=True):
            outputs[i] = rows
            if cache is not None:
                cache.encoded += 1
                if prompt.items[i].digest:
                    cache.put((prompt.items[i].digest, prompt.items[i].modality), rows)
    index: list[int] = []
    pieces: list[torch.Tensor] = []
    for run in runs:
        index.extend(range(run.start, run.start + run.length))
        out = outputs[run.item]
        assert out is not None
        pieces.append(out[run.offset : run.offset + run.length])
    if pieces:
        rows = torch.cat(pieces)
    else:  # every item lies inside the reused prefix
        rows = torch.empty(0, tower.config.out_hidden_size, dtype=tower.dtype, device=tower.device)
    positions = prompt.positions.to(tower.device)
    return EncodedMedia(positions, index, rows, prompt.rope_delta)


def chunk_inputs(
    media: EncodedMedia, start: int, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(positions [3, n], embed_index [k] relative to the chunk or None, embed_rows [k, H]).
    Positions past the prompt (a replay of committed output) are the KV index + rope_delta."""
    end = start + num_tokens
    positions = media.positions[:, start:end]
    num_prompt = media.positions.shape[1]
    if end > num_prompt:
        lo = max(start, num_prompt)
        tail = torch.arange(lo, end, device=positions.device) + media.rope_delta
        positions = torch.cat([positions, tail.expand(3, -1)], dim=1)
    lo = bisect.bisect_left(media.index, start)
    hi = bisect.bisect_left(media.index, end)
    if lo == hi:
        return positions, None, None
    rel = torch.tensor(
        [i - start for i in media.index[lo:hi]], dtype=torch.int64, device=media.rows.device
    )
    return positions, rel, media.rows[lo:hi]
