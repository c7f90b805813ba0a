"""tiny_config: the dicts parse as real Qwen3.5 configs and carry the real special ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ninfer.testing import TinySpec, tiny_config, tiny_generation_config

transformers = pytest.importorskip("transformers")


def _parse(tmp_path: Path, config: dict) -> object:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return transformers.AutoConfig.from_pretrained(tmp_path)


def test_nested_dense_config_parses_as_qwen3_5(tmp_path: Path) -> None:
    spec = TinySpec(vocab_size=1024)
    config = _parse(tmp_path, tiny_config(spec))
    assert type(config).__name__ == "Qwen3_5Config"
    text = config.text_config
    assert text.layer_types == list(spec.layer_types)
    assert text.num_key_value_heads == spec.num_kv_heads
    assert text.linear_num_value_heads == spec.num_linear_value_heads
    assert text.rope_parameters["mrope_section"] == list(spec.mrope_section)
    assert text.rope_parameters["mrope_interleaved"] is True
    assert text.rope_parameters["rope_theta"] == 1e7
    assert text.mtp_num_hidden_layers == 1  # real-checkpoint extra, kept as an attribute
    assert config.vision_config.out_hidden_size == spec.hidden_size
    # Real ids even though the tiny vocabulary is smaller.
    assert (config.image_token_id, config.video_token_id) == (248056, 248057)
    assert (config.vision_start_token_id, config.vision_end_token_id) == (248053, 248054)


def test_nested_moe_config_parses_as_qwen3_5_moe(tmp_path: Path) -> None:
    spec = TinySpec(kind="moe")
    config = _parse(tmp_path, tiny_config(spec))
    assert type(config).__name__ == "Qwen3_5MoeConfig"
    text = config.text_config
    assert (text.num_experts, text.num_experts_per_tok) == (8, 2)
    assert text.moe_intermediate_size == spec.moe_intermediate_size
    assert text.shared_expert_intermediate_size == spec.shared_expert_intermediate_size


@pytest.mark.parametrize(
    ("kind", "name"), [("dense", "Qwen3_5TextConfig"), ("moe", "Qwen3_5MoeTextConfig")]
)
def test_flat_config_is_text_only(tmp_path: Path, kind: str, name: str) -> None:
    raw = tiny_config(TinySpec(kind=kind), layout="flat", dtype=torch.float32)
    assert "vision_config" not in raw and "text_config" not in raw
    assert raw["dtype"] == "float32"
    config = _parse(tmp_path, raw)
    assert type(config).__name__ == name
    assert config.hidden_size == 64


def test_generation_config_stops_on_im_end_and_endoftext() -> None:
    generation = tiny_generation_config()
    assert generation["eos_token_id"] == [248046, 248044]
    assert generation["bos_token_id"] == generation["pad_token_id"] == 248044


def test_unknown_layout_is_rejected() -> None:
    with pytest.raises(ValueError, match="layout"):
        tiny_config(TinySpec(), layout="sideways")  # type: ignore[arg-type]
