"""Where media meets the engine: encode a request's media once, then feed each prefill chunk.

Imports torch, media.layout and model.vision. The runner calls `encode_media` once per request
before its first prefill chunk (the vision tower runs there, on the worker thread that owns the
device); `chunk_inputs` slices the [3, T] MRoPE positions and the embedding overrides of one chunk,
so media may straddle chunk boundaries. After the prompt, a decode step's position is its KV
index plus `rope_delta` (all three axes equal). Text-only requests never reach this module.
"""

from __future__ import annotations

import bisect
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


def encode_media(tower: VisionTower, prompt: MediaPrompt) -> EncodedMedia:
    """Run the vision tower over every item of `prompt` (one call) and place the merged tokens
    at their pad positions."""
    outputs = tower.encode([m.patches for m in prompt.items], [m.grid_thw for m in prompt.items])
    index: list[int] = []
    pieces: list[torch.Tensor] = []
    for run in sorted(prompt.runs, key=lambda r: r.start):
        index.extend(range(run.start, run.start + run.length))
        pieces.append(outputs[run.item][run.offset : run.offset + run.length])
    rows = torch.cat(pieces) if pieces else outputs[0][:0]
    positions = prompt.positions.to(tower.device)
    return EncodedMedia(positions, index, rows, prompt.rope_delta)


def chunk_inputs(
    media: EncodedMedia, start: int, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(positions [3, n], embed_index [k] relative to the chunk or None, embed_rows [k, H])."""
    end = start + num_tokens
    positions = media.positions[:, start:end]
    lo = bisect.bisect_left(media.index, start)
    hi = bisect.bisect_left(media.index, end)
    if lo == hi:
        return positions, None, None
    rel = torch.tensor(
        [i - start for i in media.index[lo:hi]], dtype=torch.int64, device=media.rows.device
    )
    return positions, rel, media.rows[lo:hi]
