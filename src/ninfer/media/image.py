"""Image decoding and the Qwen3.5 image preprocessing (transformers' PIL backend, step by step).

Imports pillow, numpy and torch. The order and the arithmetic follow the reference exactly so the
patches are bit-equal: RGB conversion (transparency composited onto white), smart resize to
multiples of patch x merge within the pixel bounds (PIL bicubic on uint8), rescale in float64 cast
to float32, normalize in float32, then patches in merge-block order with the frame repeated over
the temporal patch.
"""

from __future__ import annotations

import io
import math
import warnings

import numpy as np
import torch
from PIL import Image, ImageOps

from ninfer.media.errors import MEDIA_BUDGET_EXCEEDED, MediaError
from ninfer.media.prepared import PreparedMedia
from ninfer.media.settings import ImageSettings

MAX_ASPECT_RATIO = 200  # the reference refuses longer / shorter sides beyond this ratio
# Decoding refuses images beyond this many pixels before allocating them (a decompression bomb
# guard independent of the resize bounds, which only apply after decoding).
MAX_DECODED_PIXELS = 16384 * 16384


def decode_image(data: bytes, *, max_pixels: int = MAX_DECODED_PIXELS) -> Image.Image:
    """Decode encoded image bytes (any format pillow reads), EXIF orientation applied."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            width, height = img.size
            if width * height > max_pixels:
                raise MediaError(
                    f"image of {width}x{height} pixels exceeds the decode limit of "
                    f"{max_pixels} pixels",
                    code=MEDIA_BUDGET_EXCEEDED,
                )
            img.load()
        return ImageOps.exif_transpose(img) or img
    except MediaError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise MediaError(f"image is too large to decode ({e})", code=MEDIA_BUDGET_EXCEEDED) from e
    except Image.UnidentifiedImageError as e:  # its text names a BytesIO object's address
        raise MediaError(
            "cannot decode image bytes: not an image format the decoder reads (PNG, JPEG, GIF, "
            "WebP, BMP, TIFF, ...)"
        ) from e
    except Exception as e:  # pillow raises many types for bad bytes
        raise MediaError(f"cannot decode image bytes ({type(e).__name__}: {e})") from e


def to_rgb(img: Image.Image) -> Image.Image:
    """RGB, with any transparency (alpha band or palette transparency) composited onto white."""
    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return img.convert("RGB")


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """(height, width) rounded to multiples of `factor`, area within [min_pixels, max_pixels],
    aspect ratio kept as closely as possible (Python's round: halves go to even)."""
    if min(height, width) <= 0:
        raise MediaError(f"image has an empty side ({width}x{height})")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise MediaError(
            f"image aspect ratio {max(height, width) / min(height, width):.1f} exceeds "
            f"{MAX_ASPECT_RATIO}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def normalize(frames: np.ndarray, s: ImageSettings) -> np.ndarray:
    """uint8 [..., H, W, 3] -> float32, rescaled (in float64, as the reference) and normalized."""
    x = frames.astype(np.float64) * s.rescale_factor if s.do_rescale else frames
    x = x.astype(np.float32)
    if s.do_normalize:
        mean = np.asarray(s.image_mean, dtype=np.float32)
        std = np.asarray(s.image_std, dtype=np.float32)
        x = (x - mean) / std
    return x


def patchify(frames: np.ndarray, s: ImageSettings) -> tuple[np.ndarray, tuple[int, int, int]]:
    """float32 [F, H, W, 3] frames (F a multiple of the temporal patch) -> patches
    [t*h*w, 3*T*P*P] in merge-block order (block row, block col, row in block, col in block),
    each patch laid out channel, time, row, column; and the grid (t, h, w) in patches."""
    num_frames, height, width, channels = frames.shape
    p, m, tp = s.patch_size, s.merge_size, s.temporal_patch_size
    gt, gh, gw = num_frames // tp, height // p, width // p
    x = frames.reshape(gt, tp, gh // m, m, p, gw // m, m, p, channels)
    # -> (gt, gh/m, gw/m, m, m, C, tp, p, p)
    x = x.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7)
    return np.ascontiguousarray(x).reshape(gt * gh * gw, channels * tp * p * p), (gt, gh, gw)


def preprocess_image(
    img: Image.Image, s: ImageSettings, *, dtype: torch.dtype = torch.float32
) -> PreparedMedia:
    """One image -> PreparedMedia (grid t = 1: the frame repeated over the temporal patch)."""
    rgb = to_rgb(img)
    width, height = rgb.size
    new_h, new_w = smart_resize(height, width, s.factor, s.min_pixels, s.max_pixels)
    resized = rgb.resize((new_w, new_h), resample=Image.Resampling.BICUBIC)
    pixels = normalize(np.asarray(resized), s)[None]  # [1, H, W, 3]
    frames = np.broadcast_to(pixels, (s.temporal_patch_size, *pixels.shape[1:]))
    patches, grid = patchify(frames, s)
    return PreparedMedia(
        modality="image",
        patches=torch.from_numpy(patches).to(dtype),
        grid_thw=grid,
        merge_size=s.merge_size,
        decoded_pixels=width * height,
    )
