"""Video preprocessing against transformers' Qwen3-VL video processor rules (what Qwen3.5 loads).

transformers' video processor class needs torchvision for its resize, which the CPU test machine
does not have; its frame sampling, patchify, smart resize, timestamp and PyAV reading functions do
not, and are called directly as the reference. Frame resizing is compared with transformers' PIL
image transforms (pillow bicubic), which is what ninfer uses for frames.
"""

from __future__ import annotations

import importlib
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from ninfer.artifact.media_settings import IMAGE_DEFAULTS, VIDEO_DEFAULTS
from ninfer.media.errors import MediaError
from ninfer.media.settings import MediaSettings
from ninfer.media.video import decode_video, preprocess_video, video_smart_resize
from support.media_files import make_video

pytest.importorskip("av")
transformers = pytest.importorskip("transformers")
from transformers.image_transforms import normalize, rescale, resize  # noqa: E402
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor  # noqa: E402
from transformers.video_utils import VideoMetadata, read_video_pyav  # noqa: E402

ref_video = importlib.import_module("transformers.models.qwen3_vl.video_processing_qwen3_vl")
# the class is a torchvision-gated dummy; its plain functions are what the reference computes
_REF = type.__dict__["__dict__"].__get__(ref_video.Qwen3VLVideoProcessor)

VIDEO = {**VIDEO_DEFAULTS, "min_pixels": 4096, "max_pixels": 131072, "max_frames": 16}


def _settings(**video: object) -> MediaSettings:
    return MediaSettings.from_config({"image": IMAGE_DEFAULTS, "video": {**VIDEO, **video}})


def _ref_indices(s: MediaSettings, total: int, fps: float) -> list[int]:
    v = s.video
    self = types.SimpleNamespace(
        fps=v.fps, min_frames=v.min_frames, max_frames=v.max_frames, num_frames=None
    )
    meta = VideoMetadata(total_num_frames=total, fps=fps)
    return [int(i) for i in _REF["sample_frames"](self, meta, fps=v.fps)]


@pytest.mark.parametrize(
    ("frames", "fps", "overrides"),
    [
        (30, 10, {}),  # 3 s at 2 fps: 6 frames
        (7, 10, {}),  # below min_frames: 4 frames spread over 7
        (5, 24, {"min_frames": 5}),  # odd count: the last frame is repeated to pair up
        (90, 30, {"fps": 4.0, "max_frames": 10}),  # capped by max_frames
    ],
)
def test_decode_sample_and_patchify_match_reference(
    frames: int, fps: int, overrides: dict, tmp_path: Path
) -> None:
    s = _settings(**overrides)
    data = make_video(frames, fps, width=96, height=64, seed=frames)
    ours = decode_video(data, s.video)
    assert ours.total_frames == frames and ours.fps == fps
    indices = _ref_indices(s, frames, float(fps))
    assert list(ours.indices) == indices
    path = tmp_path / "clip.mp4"
    path.write_bytes(data)
    ref_frames, _ = read_video_pyav(str(path), lambda metadata, **_: np.array(indices))
    assert np.array_equal(ours.frames, ref_frames)

    prepared = preprocess_video(ours, s.video)
    v = s.video
    h, w = ref_video.smart_resize(
        len(indices), 64, 96, v.temporal_patch_size, v.factor, v.min_pixels, v.max_pixels
    )
    frames_ref = []
    for frame in ref_frames:  # transformers' PIL transforms, channels first
        chw = np.moveaxis(frame, -1, 0)
        x = resize(chw, (h, w), resample=3, input_data_format="channels_first")
        x = rescale(x, v.rescale_factor, input_data_format="channels_first")
        x = normalize(x, v.image_mean, v.image_std, input_data_format="channels_first")
        frames_ref.append(x)
    video = torch.from_numpy(np.stack(frames_ref))[None]  # [1, F, C, H, W]
    patches, gt, gh, gw = _REF["patchify"](
        None,
        video,
        patch_size=v.patch_size,
        merge_size=v.merge_size,
        temporal_patch_size=v.temporal_patch_size,
    )
    assert prepared.grid_thw == (gt, gh, gw)
    assert torch.equal(prepared.patches, patches[0])
    timestamps = Qwen3VLProcessor._calculate_timestamps(None, indices, float(fps), 2)
    assert prepared.timestamps == pytest.approx(timestamps)
    assert len(prepared.timestamps) == gt


def test_smart_resize_matches_reference_formula() -> None:
    s = _settings(min_pixels=4096, max_pixels=25165824)
    for t, h, w in [(4, 20, 3000), (768, 1080, 1920), (2, 31, 31), (16, 4000, 30)]:
        ref = ref_video.smart_resize(t, h, w, 2, 32, 4096, 25165824)
        assert video_smart_resize(t, h, w, s.video) == ref


def test_pixel_cap_per_frame_matches_reference() -> None:
    s = _settings(cap_pixels_per_frame=True, max_video_tokens=64, max_pixels=25165824)
    v = s.video
    self = types.SimpleNamespace(max_video_tokens=64)
    for t, h, w in [(8, 720, 1280), (40, 480, 640)]:
        frame_cap = self.max_video_tokens * v.factor * v.factor
        per_frame = max(min(frame_cap, v.max_pixels // t), int(v.min_pixels * 1.05))
        ref = ref_video.smart_resize(t, h, w, 2, 32, v.min_pixels, per_frame * t)
        assert video_smart_resize(t, h, w, v) == ref


@pytest.mark.parametrize("data", [b"", b"\x00" * 100, b"GIF89a not a video"], ids=str)
def test_undecodable_video_is_invalid_media(data: bytes) -> None:
    with pytest.raises(MediaError) as e:
        decode_video(data, _settings().video)
    assert e.value.code == "invalid_media"


def test_single_frame_video_is_refused() -> None:
    s = _settings(min_frames=1)
    with pytest.raises(MediaError, match="at least 2 sampled frames"):
        preprocess_video(decode_video(make_video(1, 10), s.video), s.video)
