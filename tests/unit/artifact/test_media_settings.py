"""`ninfer convert` carries the vision tower's preprocessing settings; transformers reads the same
files as the reference for what each field means."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ninfer.artifact.convert import convert
from ninfer.artifact.errors import ConversionError
from ninfer.artifact.media_settings import IMAGE_DEFAULTS, VIDEO_DEFAULTS
from ninfer.artifact.reader import Artifact
from ninfer.testing import TinySpec, make_tiny_checkpoint

transformers = pytest.importorskip("transformers")

SPEC = TinySpec(vocab_size=512, with_mtp=False, image_min_pixels=5000, image_max_pixels=70000)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("media") / "hf", SPEC, seed=3)


def _copy_without(src: Path, dst: Path, *skip: str) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in skip:
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_settings_match_what_transformers_reads(tiny_dir: Path, tmp_path: Path) -> None:
    out = convert(tiny_dir, tmp_path / "a.ninfer").path
    with Artifact(out) as art:
        media = art.config["media"]
        vision = art.config["vision"]
    image_proc = transformers.Qwen2VLImageProcessorPil.from_pretrained(tiny_dir)
    image = media["image"]
    assert image["min_pixels"] == image_proc.size["shortest_edge"] == 5000
    assert image["max_pixels"] == image_proc.size["longest_edge"] == 70000
    for key in ("patch_size", "temporal_patch_size", "merge_size"):
        assert image[key] == getattr(image_proc, key)
    assert image["image_mean"] == list(image_proc.image_mean)
    assert image["image_std"] == list(image_proc.image_std)
    assert image["rescale_factor"] == pytest.approx(image_proc.rescale_factor)
    assert image["resample"] == int(image_proc.resample)
    video_cfg = json.loads((tiny_dir / "video_preprocessor_config.json").read_text())
    video = media["video"]
    assert video["min_pixels"] == video_cfg["size"]["shortest_edge"]
    assert video["max_pixels"] == video_cfg["size"]["longest_edge"]
    assert (video["fps"], video["min_frames"], video["max_frames"]) == (
        SPEC.video_fps,
        SPEC.video_min_frames,
        SPEC.video_max_frames,
    )
    # the tower config is complete: defaults made explicit, rope theta lifted out
    assert vision["rope_theta"] == 10000.0
    assert vision["hidden_act"] == "gelu_pytorch_tanh"
    assert vision["out_hidden_size"] == SPEC.hidden_size


def test_absent_files_give_the_qwen3_5_defaults(tiny_dir: Path, tmp_path: Path) -> None:
    bare = _copy_without(
        tiny_dir, tmp_path / "bare", "preprocessor_config.json", "video_preprocessor_config.json"
    )
    with Artifact(convert(bare, tmp_path / "b.ninfer").path) as art:
        media = art.config["media"]
    assert media["image"] == IMAGE_DEFAULTS
    assert media["image"]["min_pixels"] == 65536 and media["image"]["max_pixels"] == 16777216
    assert media["video"] == VIDEO_DEFAULTS
    assert media["video"]["min_pixels"] == 4096 and media["video"]["max_pixels"] == 25165824


def test_combined_processor_config_and_legacy_pixel_names(tiny_dir: Path, tmp_path: Path) -> None:
    d = _copy_without(
        tiny_dir, tmp_path / "c", "preprocessor_config.json", "video_preprocessor_config.json"
    )
    (d / "processor_config.json").write_text(
        json.dumps(
            {
                "image_processor": {"min_pixels": 8192, "max_pixels": 40960},
                "video_processor": {"size": {"shortest_edge": 1024, "longest_edge": 9999}},
            }
        )
    )
    with Artifact(convert(d, tmp_path / "c.ninfer").path) as art:
        media = art.config["media"]
    assert (media["image"]["min_pixels"], media["image"]["max_pixels"]) == (8192, 40960)
    assert (media["video"]["min_pixels"], media["video"]["max_pixels"]) == (1024, 9999)


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("patch_size", 14, "disagrees with the vision tower"),
        ("merge_size", 3, "disagrees with the vision tower"),
        ("image_std", [0.5, 0.0, 0.5], "image_std must not contain 0"),
        ("resample", 2, "not supported"),
    ],
)
def test_inconsistent_settings_are_refused(
    tiny_dir: Path, tmp_path: Path, field: str, value: object, needle: str
) -> None:
    d = _copy_without(tiny_dir, tmp_path / "bad", "preprocessor_config.json")
    cfg = json.loads((tiny_dir / "preprocessor_config.json").read_text())
    cfg[field] = value
    (d / "preprocessor_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConversionError, match=needle):
        convert(d, tmp_path / "bad.ninfer")
    assert not (tmp_path / "bad.ninfer").exists()


def test_text_only_conversion_has_no_media(tiny_dir: Path, tmp_path: Path) -> None:
    with Artifact(convert(tiny_dir, tmp_path / "t.ninfer", components=["text"]).path) as art:
        assert art.config["media"] is None and art.config["vision"] is None


def test_inspect_artifact_shows_vision_and_media(tiny_dir: Path, tmp_path: Path) -> None:
    out = convert(tiny_dir, tmp_path / "i.ninfer").path
    run = [sys.executable, "-m", "ninfer.cli.app", "inspect-artifact", str(out)]
    info = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True).stdout)
    assert info["vision"]["depth"] == SPEC.vision_depth
    assert info["media"]["image"]["max_pixels"] == 70000
    env = {**os.environ, "COLUMNS": "200"}
    table = subprocess.run(run, capture_output=True, text=True, env=env).stdout
    assert "vision tower" in table and "media preprocessing" in table and "70000" in table
