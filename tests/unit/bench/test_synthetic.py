"""Synthetic bench models: the real sizes (FACTS.md) and exactly the weights the model binds."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from ninfer.bench.synthetic import (
    UnknownSyntheticModel,
    num_parameters,
    synthetic_config,
    weight_shapes,
)
from ninfer.cli.app import app
from ninfer.model.qwen3_5 import Qwen3_5Model

# shared/FACTS.md "Measured here": 26.9 B and 34.7 B parameters (text model only)
FACTS_PARAMS = {"qwen3.6-27b": 26.9e9, "qwen3.6-35b-a3b": 34.7e9}


@pytest.mark.parametrize("name", sorted(FACTS_PARAMS))
def test_parameter_count_matches_the_real_model(name: str) -> None:
    assert num_parameters(name) == pytest.approx(FACTS_PARAMS[name], rel=0.005)


def test_configs_carry_the_real_shapes() -> None:
    dense, moe = synthetic_config("qwen3.6-27b"), synthetic_config("qwen3.6-35b-a3b")
    assert (dense.hidden_size, dense.num_hidden_layers, dense.intermediate_size) == (
        5120,
        64,
        17408,
    )
    assert (dense.num_attention_heads, dense.num_key_value_heads, dense.head_dim) == (24, 4, 256)
    assert (dense.linear_num_key_heads, dense.linear_num_value_heads) == (16, 48)
    assert len(dense.full_attention_layers) == 16 and dense.layer_types[3].value == "full_attention"
    assert (moe.hidden_size, moe.num_hidden_layers, moe.num_experts) == (2048, 40, 256)
    assert (moe.num_experts_per_tok, moe.moe_intermediate_size, moe.linear_num_value_heads) == (
        8,
        512,
        32,
    )
    assert dense.vocab_size == moe.vocab_size == 248320 and dense.rotary_dim == 64


@pytest.mark.parametrize("name", sorted(FACTS_PARAMS))
def test_the_model_binds_every_synthetic_weight(name: str) -> None:
    """strict binding on the meta device: names and shapes agree, nothing extra, nothing missing."""
    weights = {
        n: torch.empty(s, dtype=torch.bfloat16, device="meta")
        for n, s in weight_shapes(name).items()
    }
    model = Qwen3_5Model(synthetic_config(name), weights, dtype=torch.bfloat16, device="meta")
    assert len(model.layers) == synthetic_config(name).num_hidden_layers


def test_unknown_name_is_a_typed_error() -> None:
    with pytest.raises(UnknownSyntheticModel, match="qwen3.6-27b"):
        synthetic_config("llama")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_bench_cli_says_it_needs_a_gpu() -> None:
    result = CliRunner().invoke(app, ["bench", "--synthetic", "qwen3.6-27b"])
    assert result.exit_code != 0
    assert isinstance(result.exception, Exception) and "needs a CUDA GPU" in str(result.exception)


def test_bench_cli_rejects_bad_lists() -> None:
    result = CliRunner().invoke(app, ["bench", "--synthetic", "qwen3.6-27b", "--batches", "1,x"])
    assert result.exit_code != 0
    assert "--batches must be comma-separated integers" in str(result.exception)


def test_fp8_synthetic_weights_bind_and_fuse_on_the_block_grid() -> None:
    """`bench --weights fp8`: the converter's fp8 selection with scales, bound strictly (meta
    device); on the 27B's shapes attention q/k/v and MLP gate/up merge in fp8, while DeltaNet's
    qkv/z (fp8) and b/a (bf16) cannot all merge: they become two merged pairs."""
    from ninfer.bench.synthetic import random_weights
    from ninfer.kernels.fp8_gemv.reference import Fp8Weight

    weights = random_weights("qwen3.6-27b", device="meta", fp8=True)
    assert weights["layers.0.mlp.gate_proj.weight"].dtype == torch.float8_e4m3fn
    assert weights["layers.0.mlp.gate_proj.weight_scale_inv"].shape == (136, 40)
    assert weights["lm_head.weight"].dtype == torch.bfloat16
    model = Qwen3_5Model(
        synthetic_config("qwen3.6-27b"),
        weights,
        dtype=torch.bfloat16,
        device="meta",
        fp8_weights=True,
        fuse_projections=True,
    )
    deltanet, attention = model.layers[0], model.layers[3]
    assert isinstance(attention.mixer.qkv_fused, Fp8Weight)
    assert attention.mixer.qkv_fused.scale_inv.shape == (112, 40)  # (12288 + 2 * 1024) / 128
    assert isinstance(deltanet.ffn.gate_up, Fp8Weight)
    assert deltanet.mixer.in_proj_fused is None
    assert isinstance(deltanet.mixer.in_proj_qkvz, Fp8Weight)
    assert deltanet.mixer.in_proj_qkvz.shape == (10240 + 6144, 5120)
    assert isinstance(deltanet.mixer.in_proj_ba, torch.Tensor)
    assert deltanet.mixer.in_proj_ba.shape == (96, 5120)


def test_synthetic_model_checks_before_drawing_and_builds_the_named_shape() -> None:
    """What every `ninfer bench` mode starts from: bad --weights and unknown names fail before
    any weight is drawn (nothing heard), a good call announces the draw and binds the shape."""
    from ninfer.bench.synthetic import UnknownSyntheticModel, synthetic_config, synthetic_model

    heard: list[str] = []
    with pytest.raises(ValueError, match="--weights must be bf16 or fp8, got 'int4'"):
        synthetic_model("tiny-dense", device="cpu", weights="int4", say=heard.append)
    with pytest.raises(UnknownSyntheticModel, match="unknown synthetic model 'nope'"):
        synthetic_model("nope", device="cpu", say=heard.append)
    assert heard == []
    model = synthetic_model("tiny-dense", device="cpu", say=heard.append)
    assert heard == ["drawing random tiny-dense bf16 weights on cpu"]
    assert model.config == synthetic_config("tiny-dense") and model.dtype == torch.bfloat16
