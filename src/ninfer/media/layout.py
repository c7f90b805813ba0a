"""The multimodal prompt: media placeholders expanded to merged-token pads, and MRoPE positions.

Imports numpy and torch. The chat template renders one `<|vision_start|><|image_pad|>
<|vision_end|>` per image and one `<|vision_start|><|video_pad|><|vision_end|>` per video; here an
image's pad becomes one pad per merged token, and a video's triple becomes, per temporal patch,
`<{t:.1f} seconds><|vision_start|>` + pads + `<|vision_end|>` (Qwen's processor and vLLM). Positions
follow transformers' `get_rope_index`: text advances all three axes together; a pad run (an image,
or one temporal patch of a video) takes t = start, h = start + row, w = start + column, and the
text after it resumes at start + max(rows, columns).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from ninfer.media.errors import MediaError
from ninfer.media.prepared import PreparedMedia


@dataclass(frozen=True)
class MediaTokens:
    """The special-token ids of an artifact's multimodal prompt (`config.model`)."""

    image_pad: int = 248056
    video_pad: int = 248057
    vision_start: int = 248053
    vision_end: int = 248054

    @classmethod
    def from_config(cls, model: dict) -> MediaTokens:
        return cls(
            image_pad=int(model.get("image_token_id", 248056)),
            video_pad=int(model.get("video_token_id", 248057)),
            vision_start=int(model.get("vision_start_token_id", 248053)),
            vision_end=int(model.get("vision_end_token_id", 248054)),
        )


@dataclass(frozen=True)
class MediaRun:
    """One contiguous run of pad tokens: `length` merged tokens of item `item`, starting at
    prompt index `start` and at row `offset` of that item's tower output."""

    item: int
    start: int
    length: int
    offset: int


class _Anonymous:
    """The identity of media built from pixels (no source digest): equal only to itself."""


def media_key(item: PreparedMedia) -> Hashable:
    """What makes two prepared items the same model input: the source bytes' SHA-256 and the
    modality (the payload cache's key), plus the grid, merge size and frame times that decide
    the pad count and the MRoPE layout."""
    if not item.digest:
        return _Anonymous()
    return (item.modality, item.digest, item.grid_thw, item.merge_size, item.timestamps)


@dataclass(frozen=True, eq=False)
class MediaPrompt:
    """An expanded prompt: ids, [3, T] positions, the media and where their tokens go.

    `shifts` maps offsets in the rendered ids (before expansion) to the expanded prompt: each
    entry is (rendered index just past a placeholder, expanded minus rendered index from there).
    """

    token_ids: tuple[int, ...]
    positions: torch.Tensor  # [3, T] int64
    rope_delta: int  # decode position of prompt index i >= T is i + rope_delta
    items: tuple[PreparedMedia, ...]
    runs: tuple[MediaRun, ...]
    shifts: tuple[tuple[int, int], ...] = ()

    @property
    def num_media_tokens(self) -> int:
        return sum(r.length for r in self.runs)

    @cached_property
    def identity(self) -> tuple[Hashable, ...]:
        """The prompt's prefix identity (what the prefix cache compares): the token ids, except
        that each pad is (its item's `media_key`, its row in the item's tower output). Two
        different images with the same pad count therefore diverge at their first pad; equal
        identities up to a point imply equal media, grids and MRoPE positions up to there (the
        positions are a function of the ids and the grids before them)."""
        out: list[Hashable] = list(self.token_ids)
        keys = [media_key(item) for item in self.items]
        for run in self.runs:
            key = keys[run.item]
            for k in range(run.length):
                out[run.start + k] = (key, run.offset + k)
        return tuple(out)

    def expanded_offset(self, offset: int) -> int:
        """A token offset of the rendered ids (a cache checkpoint candidate) in this prompt."""
        i = bisect.bisect_right(self.shifts, (offset, float("inf"))) - 1
        return offset + (self.shifts[i][1] if i >= 0 else 0)


def count_placeholders(ids: Sequence[int], tokens: MediaTokens) -> tuple[int, int]:
    """(images, videos) placeholders in rendered ids."""
    return sum(1 for t in ids if t == tokens.image_pad), sum(
        1 for t in ids if t == tokens.video_pad
    )


def expand_prompt(
    ids: Sequence[int],
    items: Sequence[PreparedMedia],
    tokens: MediaTokens,
    encode_text: Callable[[str], list[int]],
) -> MediaPrompt:
    """Expand each placeholder for the next item (in order) and lay out MRoPE positions.

    Raises MediaError when the placeholders and the items disagree in number or kind.
    """
    out: list[int] = []
    runs: list[MediaRun] = []
    shifts: list[tuple[int, int]] = []
    pads = {tokens.image_pad: "image", tokens.video_pad: "video"}
    next_item = 0
    i = 0
    while i < len(ids):
        tok = ids[i]
        if tok not in pads:
            out.append(tok)
            i += 1
            continue
        kind = pads[tok]
        if next_item >= len(items):
            raise MediaError(f"the prompt has more {kind} placeholders than media items")
        item = items[next_item]
        if item.modality != kind:
            raise MediaError(
                f"media item {next_item} is a {item.modality}, its placeholder is for an {kind}"
            )
        if kind == "image":
            runs.append(MediaRun(next_item, len(out), item.num_tokens, 0))
            out.extend([tok] * item.num_tokens)
            i += 1
        else:
            wrapped = (
                out
                and out[-1] == tokens.vision_start
                and i + 1 < len(ids)
                and ids[i + 1] == tokens.vision_end
            )
            if wrapped:
                out.pop()  # the template's vision_start; each frame brings its own pair
            per_frame = item.tokens_per_frame
            for frame, t in enumerate(item.timestamps):
                out.extend(encode_text(f"<{t:.1f} seconds>"))
                out.append(tokens.vision_start)
                runs.append(MediaRun(next_item, len(out), per_frame, frame * per_frame))
                out.extend([tok] * per_frame)
                out.append(tokens.vision_end)
            i += 2 if wrapped else 1
        next_item += 1
        shifts.append((i, len(out) - i))
    if next_item != len(items):
        raise MediaError(
            f"{len(items)} media items but the rendered prompt has {next_item} placeholders"
        )
    positions, delta = mrope_positions(len(out), runs, items)
    return MediaPrompt(tuple(out), positions, delta, tuple(items), tuple(runs), tuple(shifts))


def mrope_positions(
    num_tokens: int, runs: Sequence[MediaRun], items: Sequence[PreparedMedia]
) -> tuple[torch.Tensor, int]:
    """[3, T] positions and the rope delta of the tokens after the prompt."""
    pos = np.empty((3, num_tokens), dtype=np.int64)
    current = 0
    cursor = 0
    for run in runs:
        text = run.start - cursor
        pos[:, cursor : run.start] = np.arange(current, current + text)
        current += text
        item = items[run.item]
        _, gh, gw = item.grid_thw
        rows, cols = gh // item.merge_size, gw // item.merge_size
        end = run.start + run.length
        pos[0, run.start : end] = current
        pos[1, run.start : end] = current + np.repeat(np.arange(rows), cols)
        pos[2, run.start : end] = current + np.tile(np.arange(cols), rows)
        current += max(rows, cols)
        cursor = end
    tail = num_tokens - cursor
    pos[:, cursor:] = np.arange(current, current + tail)
    current += tail
    return torch.from_numpy(pos), current - num_tokens
