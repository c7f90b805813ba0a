"""Video decoding with av and the Qwen3.5 video preprocessing (Qwen3-VL video processor rules).

Imports av lazily (the `media` extra), numpy, pillow and torch. Frames are sampled at the
configured fps between min and max frames from the stream's frame rate and frame count as PyAV
reports them; the frame count is padded to the temporal patch by repeating the last frame; each
temporal patch carries the mean time of its frames, which the prompt writes as `<t seconds>`.
Frames are resized with pillow's bicubic filter (the transformers video processor uses
torchvision's, which differs in the last bits); everything after that matches the image path.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from ninfer.media.errors import MEDIA_BUDGET_EXCEEDED, MediaError
from ninfer.media.image import MAX_ASPECT_RATIO, normalize, patchify
from ninfer.media.prepared import PreparedMedia
from ninfer.media.settings import VideoSettings

MAX_DECODED_FRAME_PIXELS = 8192 * 8192


@dataclass(frozen=True)
class DecodedVideo:
    frames: np.ndarray  # uint8 [F, H, W, 3]: the sampled frames only
    fps: float  # the stream's average frame rate
    total_frames: int
    indices: tuple[int, ...]  # which frames were sampled


def sample_indices(total_frames: int, video_fps: float, s: VideoSettings) -> list[int]:
    """Frame indices: `fps` frames per second of video, clamped to [min_frames, max_frames] and
    to the frames available, spread evenly from the first to the last frame."""
    if not s.do_sample_frames:
        return list(range(total_frames))
    if s.num_frames is not None:
        count = s.num_frames
    else:
        count = int(total_frames / video_fps * s.fps)
        count = min(max(count, s.min_frames), s.max_frames, total_frames)
    return np.linspace(0, total_frames - 1, count).round().astype(int).tolist()


def _open(data: bytes):  # noqa: ANN202  (av is an optional dependency)
    try:
        import av
    except ImportError as e:
        raise MediaError("video input needs PyAV (pip install 'ninfer[media]')") from e
    try:
        return av.open(io.BytesIO(data), mode="r")
    except Exception as e:  # av raises its own error hierarchy for bad bytes
        raise MediaError(f"cannot decode video bytes ({type(e).__name__}: {e})") from e


def decode_video(data: bytes, s: VideoSettings) -> DecodedVideo:
    """Decode the first video stream and keep the sampled frames as RGB arrays."""
    container = _open(data)
    try:
        if not container.streams.video:
            raise MediaError("the media has no video stream")
        stream = container.streams.video[0]
        if stream.width * stream.height > MAX_DECODED_FRAME_PIXELS:
            raise MediaError(
                f"video frames of {stream.width}x{stream.height} exceed the decode limit",
                code=MEDIA_BUDGET_EXCEEDED,
            )
        rate = stream.average_rate
        fps = float(rate) if rate else 0.0
        total = int(stream.frames or 0)
        if total <= 0:  # containers without a frame count: count by decoding
            total = sum(1 for _ in container.decode(video=0))
            container.seek(0)
        if total <= 0 or fps <= 0:
            raise MediaError("the video has no frames or no frame rate")
        indices = sample_indices(total, fps, s)
        wanted = set(indices)
        last = indices[-1]
        frames: dict[int, np.ndarray] = {}
        for i, frame in enumerate(container.decode(video=0)):
            if i > last:
                break
            if i in wanted:
                frames[i] = frame.to_ndarray(format="rgb24")
    except MediaError:
        raise
    except Exception as e:
        raise MediaError(f"cannot decode video bytes ({type(e).__name__}: {e})") from e
    finally:
        container.close()
    if len(frames) < len(wanted):
        raise MediaError(
            f"the video stream ends after {len(frames)} of the {len(wanted)} sampled frames "
            f"(it reports {total})"
        )
    return DecodedVideo(
        frames=np.stack([frames[i] for i in indices]),
        fps=fps,
        total_frames=total,
        indices=tuple(indices),
    )


def video_smart_resize(
    num_frames: int, height: int, width: int, s: VideoSettings
) -> tuple[int, int]:
    """The frame size: like the image rule, but the pixel bounds cover all frames together."""
    factor, tp = s.factor, s.temporal_patch_size
    if num_frames < tp:
        raise MediaError(f"a video needs at least {tp} sampled frames, got {num_frames}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError(f"video aspect ratio exceeds {MAX_ASPECT_RATIO}")
    max_pixels = s.max_pixels
    if s.cap_pixels_per_frame:
        per_frame = max(
            min(s.max_video_tokens * factor * factor, s.max_pixels // num_frames),
            int(s.min_pixels * 1.05),
        )
        max_pixels = per_frame * num_frames
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / tp) * tp
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < s.min_pixels:
        beta = math.sqrt(s.min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def patch_timestamps(indices: tuple[int, ...], fps: float, temporal_patch: int) -> list[float]:
    """Mean time (seconds) of the first and last frame of each temporal patch; the index list
    is padded with its last entry, as the frames are."""
    idx = list(indices)
    if len(idx) % temporal_patch:
        idx.extend([idx[-1]] * (temporal_patch - len(idx) % temporal_patch))
    times = [i / fps for i in idx]
    return [
        (times[i] + times[i + temporal_patch - 1]) / 2 for i in range(0, len(times), temporal_patch)
    ]


def preprocess_video(
    video: DecodedVideo, s: VideoSettings, *, dtype: torch.dtype = torch.float32
) -> PreparedMedia:
    num_frames, height, width, _ = video.frames.shape
    new_h, new_w = video_smart_resize(num_frames, height, width, s)
    resized = np.stack(
        [
            np.asarray(
                Image.fromarray(frame).resize((new_w, new_h), resample=Image.Resampling.BICUBIC)
            )
            for frame in video.frames
        ]
    )
    if pad := -num_frames % s.temporal_patch_size:
        resized = np.concatenate([resized, np.repeat(resized[-1:], pad, axis=0)])
    patches, grid = patchify(normalize(resized, s), s)
    return PreparedMedia(
        modality="video",
        patches=torch.from_numpy(patches).to(dtype),
        grid_thw=grid,
        merge_size=s.merge_size,
        timestamps=tuple(patch_timestamps(video.indices, video.fps, s.temporal_patch_size)),
        decoded_pixels=num_frames * height * width,
        meta={"fps": video.fps, "total_frames": float(video.total_frames)},
    )
