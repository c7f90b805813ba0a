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
