"""PreparedMedia: one decoded, resized and patchified image or video, ready for the tower.

Imports torch only. Immutable once built: the cache hands the same object to every request that
uses the same bytes, so nothing downstream may write into `patches`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

Modality = Literal["image", "video"]


@dataclass(frozen=True, eq=False)
class PreparedMedia:
    """Patches [t*h*w, C*T*P*P] in the processor's merge-block order and the grid (t, h, w) in
    patches; a video also carries the mean time (seconds) of each temporal patch."""

    modality: Modality
    patches: torch.Tensor
    grid_thw: tuple[int, int, int]
    merge_size: int
    timestamps: tuple[float, ...] = ()
    digest: str = ""  # SHA-256 of the source bytes (hex); "" when built from pixels
    source_bytes: int = 0
    decoded_pixels: int = 0  # pixels decoded (all sampled frames) before resizing
    meta: dict[str, float] = field(default_factory=dict)

    @property
    def num_patches(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w

    @property
    def tokens_per_frame(self) -> int:
        """Merged tokens of one temporal patch (the pads between one vision_start / end pair)."""
        _, h, w = self.grid_thw
        return (h // self.merge_size) * (w // self.merge_size)

    @property
    def num_tokens(self) -> int:
        """Merged tokens the language model sees (the expanded pad count)."""
        return self.grid_thw[0] * self.tokens_per_frame

    @property
    def nbytes(self) -> int:
        return self.patches.numel() * self.patches.element_size()
