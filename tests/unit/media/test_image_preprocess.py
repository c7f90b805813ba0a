"""Image preprocessing equals transformers' Qwen2-VL PIL processor (what Qwen3.5 loads), bit for
bit, across sizes, aspect ratios and image modes; every setting comes from the artifact."""

from __future__ import annotations

import pytest
import torch

from ninfer.artifact.media_settings import IMAGE_DEFAULTS, VIDEO_DEFAULTS
from ninfer.media.errors import MediaError
from ninfer.media.image import decode_image, preprocess_image, smart_resize
from ninfer.media.settings import MediaSettings
from support.media_files import encode_image, noise_image

transformers = pytest.importorskip("transformers")


def _settings(**image: object) -> MediaSettings:
    config = {"image": {**IMAGE_DEFAULTS, **image}, "video": VIDEO_DEFAULTS}
    return MediaSettings.from_config(config)


def _reference(s: MediaSettings) -> object:
    i = s.image
    return transformers.Qwen2VLImageProcessorPil(
        size={"shortest_edge": i.min_pixels, "longest_edge": i.max_pixels},
        patch_size=i.patch_size,
        merge_size=i.merge_size,
        temporal_patch_size=i.temporal_patch_size,
        image_mean=list(i.image_mean),
        image_std=list(i.image_std),
    )


SMALL = {"min_pixels": 4096, "max_pixels": 65536}


@pytest.mark.parametrize(
    ("width", "height", "mode"),
    [
        (37, 91, "RGB"),  # odd sides, below the minimum area: scaled up
        (1001, 333, "RGB"),  # odd sides above the maximum: scaled down
        (600, 4, "RGB"),  # extreme aspect ratio (150:1)
        (5, 700, "L"),  # grayscale, tall
        (123, 77, "RGBA"),  # alpha composited onto white
        (64, 96, "LA"),
        (81, 49, "P"),  # palette with a transparent index
        (70, 50, "I;16"),
        (40, 60, "CMYK"),
        (256, 256, "RGB"),  # exactly on the grid: no resize
    ],
)
def test_equals_transformers_pil_processor(width: int, height: int, mode: str) -> None:
    s = _settings(**SMALL)
    img = noise_image(width, height, mode, seed=width + height)
    ours = preprocess_image(img, s.image)
    ref = _reference(s)(images=[img], return_tensors="pt")
    assert list(ours.grid_thw) == ref["image_grid_thw"][0].tolist()
    assert torch.equal(ours.patches, ref["pixel_values"])
    assert ours.num_tokens == ours.num_patches // 4


def test_other_checkpoint_settings_are_honoured() -> None:
    """Mean/std, patch size and bounds all come from the settings (no constants)."""
    s = _settings(
        min_pixels=3000,
        max_pixels=40000,
        patch_size=14,
        image_mean=[0.48145466, 0.4578275, 0.40821073],
        image_std=[0.26862954, 0.26130258, 0.27577711],
    )
    img = noise_image(333, 201, seed=4)
    ours = preprocess_image(img, s.image)
    ref = _reference(s)(images=[img], return_tensors="pt")
    assert list(ours.grid_thw) == ref["image_grid_thw"][0].tolist()
    assert ours.patches.shape[1] == 3 * 2 * 14 * 14
    assert torch.equal(ours.patches, ref["pixel_values"])


def test_default_bounds_match_reference_grid_for_a_large_photo() -> None:
    s = _settings()  # the real Qwen3.5 bounds
    img = noise_image(1920, 1080, seed=1)
    ours = preprocess_image(img, s.image)
    ref = _reference(s)(images=[img], return_tensors="pt")
    assert list(ours.grid_thw) == ref["image_grid_thw"][0].tolist() == [1, 68, 120]
    assert torch.equal(ours.patches, ref["pixel_values"])


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP", "BMP"])
def test_decode_formats(fmt: str) -> None:
    img = noise_image(50, 30, "RGB" if fmt != "GIF" else "P", seed=2)
    decoded = decode_image(encode_image(img, fmt))
    assert decoded.size == (50, 30)


def test_smart_resize_matches_reference_formula() -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        smart_resize as ref_resize,
    )

    for h, w in [(1, 1), (17, 3000), (32, 32), (999, 1), (4096, 4096), (12345, 678)]:
        if max(h, w) / min(h, w) > 200:
            with pytest.raises(MediaError, match="aspect ratio"):
                smart_resize(h, w, 32, 65536, 16777216)
            continue
        assert smart_resize(h, w, 32, 65536, 16777216) == ref_resize(
            h, w, factor=32, min_pixels=65536, max_pixels=16777216
        )


@pytest.mark.parametrize(
    "data", [b"", b"not an image", encode_image(noise_image(20, 20))[:40]], ids=str
)
def test_undecodable_bytes_are_invalid_media(data: bytes) -> None:
    with pytest.raises(MediaError) as e:
        decode_image(data)
    assert e.value.code == "invalid_media"
    assert " at 0x" not in e.value.message  # no object address reaches the client


def test_unknown_formats_are_named_plainly() -> None:
    with pytest.raises(MediaError, match=r"^cannot decode image bytes: not an image format"):
        decode_image(b"%PDF-1.7 not an image at all")


def test_decode_limit_is_a_budget_error() -> None:
    with pytest.raises(MediaError) as e:
        decode_image(encode_image(noise_image(300, 300)), max_pixels=300 * 299)
    assert e.value.code == "media_budget_exceeded"


def test_settings_refuse_unsupported_switches() -> None:
    with pytest.raises(MediaError, match="do_resize=false"):
        _settings(do_resize=False)
