"""TinySpec validation and derived sizes."""

from __future__ import annotations

import pytest

from ninfer.testing import TinySpec, TinySpecError


def test_default_spec_is_hybrid_three_linear_then_one_full() -> None:
    assert TinySpec().layer_types == (
        "linear_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
    )
    eight = TinySpec(num_layers=8).layer_types
    assert [i for i, t in enumerate(eight) if t == "full_attention"] == [3, 7]


def test_default_spec_mirrors_real_ratios() -> None:
    spec = TinySpec()
    assert spec.rotary_dim == 8  # 32 * 0.25, as 256 * 0.25 = 64 in the real models
    assert 2 * sum(spec.mrope_section) == spec.rotary_dim
    assert spec.num_linear_key_heads < spec.num_linear_value_heads
    assert spec.linear_conv_dim == 2 * 2 * 16 + 6 * 16


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({"kind": "sparse"}, id="unknown-kind"),
        pytest.param({"mrope_section": (2, 2, 1)}, id="mrope-sum"),
        pytest.param({"partial_rotary_factor": 0.3}, id="odd-rotary"),
        pytest.param({"num_attention_heads": 3}, id="gqa-ratio"),
        pytest.param({"num_linear_value_heads": 5}, id="deltanet-ratio"),
        pytest.param({"num_experts_per_token": 9}, id="top-k"),
        pytest.param({"vision_num_position_embeddings": 15}, id="pos-grid"),
        pytest.param({"vision_hidden_size": 36}, id="vision-rotary"),
        pytest.param({"hidden_size": 0}, id="zero-size"),
    ],
)
def test_inconsistent_specs_are_rejected(kwargs: dict) -> None:
    with pytest.raises(TinySpecError):
        TinySpec(**kwargs)
