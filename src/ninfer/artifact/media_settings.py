"""Image and video preprocessing settings of a vision checkpoint, resolved once at convert time.

Reads `preprocessor_config.json` / `video_preprocessor_config.json` (or the combined
`processor_config.json`) and fills what they omit with the Qwen3.5 defaults, so the artifact holds
every number `ninfer.media` needs and the runtime never falls back to constants. Imports only the
standard library; the checks against the vision config (patch, merge, temporal sizes) live here
because a mismatch would make every image's grid disagree with the tower.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ninfer.artifact.errors import ConversionError

# Qwen3.5 / 3.6 checkpoints ship these (preprocessor_config.json, video_preprocessor_config.json);
# the remaining video fields are the Qwen3-VL video processor's class defaults.
IMAGE_DEFAULTS: dict[str, Any] = {
    "min_pixels": 65536,  # size.shortest_edge: the smallest area an image is resized to
    "max_pixels": 16777216,  # size.longest_edge: the largest area
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "rescale_factor": 1.0 / 255.0,
    "do_resize": True,
    "do_rescale": True,
    "do_normalize": True,
    "do_convert_rgb": True,
    "resample": 3,  # PIL bicubic
}
VIDEO_DEFAULTS: dict[str, Any] = {
    **IMAGE_DEFAULTS,
    "min_pixels": 4096,
    "max_pixels": 25165824,
    "fps": 2.0,
    "min_frames": 4,
    "max_frames": 768,
    "cap_pixels_per_frame": False,
    "max_video_tokens": 768,
}
_RESAMPLE_NAMES = {"bicubic": 3, "bilinear": 2, "nearest": 0, "lanczos": 1}


def _load(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ConversionError(path, f"not valid JSON ({e.msg})") from e
    if not isinstance(raw, dict):
        raise ConversionError(path, "must hold a JSON object")
    return raw


def _resolve(raw: dict[str, Any] | None, defaults: dict[str, Any], where: Path) -> dict[str, Any]:
    out = dict(defaults)
    if not raw:
        return out
    size = raw.get("size") or {}
    if not isinstance(size, dict):
        raise ConversionError(where, f"size must be an object, got {size!r}")
    # older exporters spell the bounds min_pixels / max_pixels at the top level
    for key, size_key in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        value = raw.get(key, size.get(size_key))
        if value is not None:
            out[key] = int(value)
    for key in defaults:
        if key in ("min_pixels", "max_pixels") or raw.get(key) is None:
            continue
        value = raw[key]
        if key == "resample" and isinstance(value, str):
            value = _RESAMPLE_NAMES.get(value.lower(), value)
        out[key] = value
    if raw.get("num_frames") is not None:
        out["num_frames"] = int(raw["num_frames"])
    if raw.get("do_sample_frames") is False:
        out["do_sample_frames"] = False
    return _validated(out, where)


def _validated(s: dict[str, Any], where: Path) -> dict[str, Any]:
    for key in ("min_pixels", "max_pixels", "patch_size", "temporal_patch_size", "merge_size"):
        if not isinstance(s[key], int) or s[key] <= 0:
            raise ConversionError(where, f"{key} must be a positive integer, got {s[key]!r}")
    if s["min_pixels"] > s["max_pixels"]:
        raise ConversionError(where, "size.shortest_edge exceeds size.longest_edge")
    for key in ("image_mean", "image_std"):
        value = s[key]
        if isinstance(value, int | float):
            value = [float(value)] * 3
        if not (isinstance(value, list) and len(value) == 3):
            raise ConversionError(where, f"{key} must hold 3 numbers, got {value!r}")
        s[key] = [float(v) for v in value]
    if any(v == 0 for v in s["image_std"]):
        raise ConversionError(where, "image_std must not contain 0")
    if s["resample"] != 3:
        raise ConversionError(where, f"resample {s['resample']!r} is not supported (bicubic: 3)")
    s["rescale_factor"] = float(s["rescale_factor"])
    if "fps" in s:
        s["fps"] = float(s["fps"])
        for key in ("min_frames", "max_frames"):
            s[key] = int(s[key])
        if not 0 < s["min_frames"] <= s["max_frames"] or s["fps"] <= 0:
            raise ConversionError(where, "video fps / min_frames / max_frames are inconsistent")
    return s


def media_settings(ckpt_dir: Path, vision: dict[str, Any]) -> dict[str, Any]:
    """{"image": {...}, "video": {...}} for a checkpoint with a vision tower (see docs/artifact.md).

    Raises ConversionError when a file is malformed or disagrees with the vision config.
    """
    combined = _load(ckpt_dir / "processor_config.json") or {}
    image_raw = _load(ckpt_dir / "preprocessor_config.json") or combined.get("image_processor")
    video_raw = _load(ckpt_dir / "video_preprocessor_config.json") or combined.get(
        "video_processor"
    )
    image = _resolve(image_raw, IMAGE_DEFAULTS, ckpt_dir / "preprocessor_config.json")
    video = _resolve(video_raw, VIDEO_DEFAULTS, ckpt_dir / "video_preprocessor_config.json")
    tower = {
        "patch_size": int(vision.get("patch_size", 16)),
        "temporal_patch_size": int(vision.get("temporal_patch_size", 2)),
        "merge_size": int(vision.get("spatial_merge_size", 2)),
    }
    for name, settings in (("image", image), ("video", video)):
        for key, want in tower.items():
            if settings[key] != want:
                raise ConversionError(
                    ckpt_dir,
                    f"{name} preprocessing {key} {settings[key]} disagrees with the vision "
                    f"tower's {want}",
                )
    return {"image": image, "video": video}
