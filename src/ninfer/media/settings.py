"""The preprocessing settings of one artifact, as typed values (from `config.media`).

Imports only ninfer.media.errors. Every number the preprocessing uses comes from here, and these
come from the artifact (the converter resolved the checkpoint's files and the Qwen3.5 defaults),
so a checkpoint with other values works without code changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ninfer.media.errors import MediaError


@dataclass(frozen=True)
class ImageSettings:
    min_pixels: int
    max_pixels: int
    patch_size: int
    temporal_patch_size: int
    merge_size: int
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]
    rescale_factor: float
    do_rescale: bool = True
    do_normalize: bool = True

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this: one merged token covers factor x factor pixels."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size


@dataclass(frozen=True)
class VideoSettings(ImageSettings):
    fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    num_frames: int | None = None  # a fixed frame count instead of fps sampling
    do_sample_frames: bool = True
    cap_pixels_per_frame: bool = False
    max_video_tokens: int = 768


_COMMON = (
    "min_pixels",
    "max_pixels",
    "patch_size",
    "temporal_patch_size",
    "merge_size",
    "rescale_factor",
    "do_rescale",
    "do_normalize",
)


def _common(raw: Mapping[str, Any], what: str) -> dict[str, Any]:
    for flag in ("do_resize", "do_convert_rgb"):
        if raw.get(flag) is False:
            raise MediaError(f"{what} preprocessing with {flag}=false is not supported")
    out = {k: raw[k] for k in _COMMON if k in raw}
    out["image_mean"] = tuple(float(v) for v in raw["image_mean"])
    out["image_std"] = tuple(float(v) for v in raw["image_std"])
    return out


@dataclass(frozen=True)
class MediaSettings:
    image: ImageSettings
    video: VideoSettings

    @classmethod
    def from_config(cls, media: Mapping[str, Any]) -> MediaSettings:
        """From an artifact's `config.media` (see docs/artifact.md)."""
        image = ImageSettings(**_common(media["image"], "image"))
        raw_video = media["video"]
        extra = {
            k: raw_video[k]
            for k in (
                "fps",
                "min_frames",
                "max_frames",
                "num_frames",
                "do_sample_frames",
                "cap_pixels_per_frame",
                "max_video_tokens",
            )
            if k in raw_video
        }
        video = VideoSettings(**_common(raw_video, "video"), **extra)
        return cls(image, video)
