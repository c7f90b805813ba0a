"""TextConfig.from_hf: nested and flat configs, family defaults, validation messages."""

from __future__ import annotations

import copy

import pytest

from ninfer.model.config import LayerType, TextConfig
from ninfer.model.errors import ConfigError

# The published shapes (shared/FACTS.md), as a config.json would hold them.
DENSE_27B = {
    "model_type": "qwen3_5",
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "qwen3_5_text",
        "vocab_size": 248320,
        "hidden_size": 5120,
        "num_hidden_layers": 64,
        "full_attention_interval": 4,
        "num_attention_heads": 24,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "attn_output_gate": True,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "intermediate_size": 17408,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
    },
    "vision_config": {"depth": 27},
}
MOE_35B_TEXT = {
    "model_type": "qwen3_5_moe_text",
    "vocab_size": 248320,
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "rope_theta": 10000000,
    "partial_rotary_factor": 0.25,
}


def test_dense_27b_nested():
    c = TextConfig.from_hf(DENSE_27B)
    assert not c.is_moe and c.intermediate_size == 17408
    assert c.rotary_dim == 64 and c.mrope_section == (11, 11, 10) and c.mrope_interleaved
    assert c.rope_theta == 1e7
    assert c.layer_types[:4] == (LayerType.LINEAR,) * 3 + (LayerType.FULL,)
    assert len(c.full_attention_layers) == 16 and len(c.linear_attention_layers) == 48
    assert c.full_attention_layers[:2] == (3, 7)
    assert c.conv_dim == 2 * 16 * 128 + 48 * 128
    assert c.tie_word_embeddings is False


def test_moe_flat_with_top_level_rope_fields():
    c = TextConfig.from_hf(MOE_35B_TEXT)
    assert c.is_moe and c.num_experts == 256 and c.num_experts_per_tok == 8
    assert c.norm_topk_prob is True and c.intermediate_size == 0
    assert c.rope_theta == 1e7 and c.rotary_dim == 64
    assert c.mrope_section == (11, 11, 10)  # transformers' default when absent


def test_explicit_layer_types_win():
    d = copy.deepcopy(MOE_35B_TEXT)
    d["num_hidden_layers"] = 2
    d["layer_types"] = ["full_attention", "linear_attention"]
    assert TextConfig.from_hf(d).layer_types == (LayerType.FULL, LayerType.LINEAR)


def test_hf_to_dict_round_trip():
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3_5MoeTextConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=8,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=8,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 5e5,
            "partial_rotary_factor": 0.25,
            "mrope_section": [1, 1, 0],
        },
    )
    c = TextConfig.from_hf(hf.to_dict())
    assert [t.value for t in c.layer_types] == hf.layer_types
    assert (c.rope_theta, c.rotary_dim, c.mrope_section) == (5e5, 4, (1, 1, 0))


def _broken(path: str, value):
    d = copy.deepcopy(DENSE_27B)
    target = d["text_config"]
    *parents, leaf = path.split(".")
    for p in parents:
        target = target[p]
    if value is KeyError:
        del target[leaf]
    else:
        target[leaf] = value
    return d


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("hidden_size", KeyError, "missing field 'hidden_size'"),
        ("hidden_size", "5120", "'hidden_size' must be an integer"),
        ("head_dim", 0, "'head_dim' must be > 0"),
        ("num_key_value_heads", 5, "'num_attention_heads'"),
        ("linear_num_value_heads", 40, "'linear_num_value_heads'"),
        ("rope_parameters.mrope_section", [11, 11, 11], "'mrope_section'"),
        ("rope_parameters.rope_type", "yarn", "rope_type"),
        ("hidden_act", "gelu", "'hidden_act'"),
        ("attn_output_gate", False, "'attn_output_gate'"),
        ("layer_types", ["linear_attention"] * 63 + ["sliding"], "'layer_types'"),
        ("layer_types", ["linear_attention"] * 3, "'layer_types' has 3 entries"),
        ("intermediate_size", KeyError, "missing field 'intermediate_size'"),
        ("rms_norm_eps", True, "'rms_norm_eps' must be a number"),
    ],
)
def test_validation_names_the_field(path, value, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        TextConfig.from_hf(_broken(path, value))


def test_moe_top_k_must_fit():
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        TextConfig.from_hf({**MOE_35B_TEXT, "num_experts_per_tok": 300})


def test_config_is_frozen_and_error_is_value_error():
    c = TextConfig.from_hf(DENSE_27B)
    with pytest.raises(AttributeError):
        c.hidden_size = 1  # type: ignore[misc]
    assert issubclass(ConfigError, ValueError)
