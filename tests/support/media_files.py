"""Test support: small images and videos made on the fly (pillow, av), as encoded bytes."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image


def noise_image(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    """A random image in `mode` (RGB, L, RGBA, LA, P with a transparent index, I;16, CMYK)."""
    rng = np.random.default_rng(seed)
    rgb = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    if mode == "RGBA":
        return Image.fromarray(rng.integers(0, 256, (height, width, 4), dtype=np.uint8), "RGBA")
    if mode == "P":
        img = rgb.convert("P")
        img.info["transparency"] = 5
        return img
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65536, (height, width), dtype=np.uint16))
    return rgb.convert(mode)


def encode_image(img: Image.Image, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def make_video(
    num_frames: int = 30, fps: int = 10, width: int = 96, height: int = 64, seed: int = 0
) -> bytes:
    """An mp4 (mpeg4) clip whose frames differ from each other (a moving bar plus noise)."""
    import av

    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    container = av.open(buf, mode="w", format="mp4")
    stream = container.add_stream("mpeg4", rate=fps)
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    for i in range(num_frames):
        frame = rng.integers(0, 40, (height, width, 3), dtype=np.uint8)
        x = (i * 7) % width
        frame[:, x : x + 8, :] = 230
        frame[: height // 2, : width // 2, 1] = (i * 9) % 256
        for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)
    container.close()
    return buf.getvalue()
