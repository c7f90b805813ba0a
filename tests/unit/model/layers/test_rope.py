"""MRoPE tables and rotation against transformers' Qwen3.5 rotary embedding."""

from __future__ import annotations

import pytest
import torch

from ninfer.model.layers.rope import apply_rope, mrope_axis_map, rope_cos_sin, rope_inv_freq

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


def hf_rotary(section, head_dim=32, factor=0.5, theta=1e6):
    rope = {
        "rope_type": "default",
        "rope_theta": theta,
        "partial_rotary_factor": factor,
        "mrope_section": list(section),
        "mrope_interleaved": True,
    }
    config = transformers.Qwen3_5TextConfig(
        vocab_size=8, hidden_size=64, num_hidden_layers=1, head_dim=head_dim, rope_parameters=rope
    )
    return hf.Qwen3_5TextRotaryEmbedding(config)


def test_axis_map_interleaved_by_hand():
    # Section (2, 1, 1): freq 1 reads h, freq 2 reads w, freqs 0 and 3 read t.
    assert mrope_axis_map((2, 1, 1), True).tolist() == [0, 1, 2, 0]
    # The family's (11, 11, 10): h at 1, 4, ..., 31; w at 2, 5, ..., 29; t elsewhere.
    axes = mrope_axis_map((11, 11, 10), True).tolist()
    assert [i for i, a in enumerate(axes) if a == 1] == list(range(1, 33, 3))
    assert [i for i, a in enumerate(axes) if a == 2] == list(range(2, 30, 3))
    assert axes.count(0) == 11 and axes[30] == 0 and axes[31] == 1


def test_axis_map_sectioned_by_hand():
    assert mrope_axis_map((3, 2, 1), False).tolist() == [0, 0, 0, 1, 1, 2]


@pytest.mark.parametrize("section", [(2, 1, 1), (3, 3, 2)])
def test_cos_sin_match_transformers_with_distinct_axes(section):
    rotary_dim = 2 * sum(section)
    module = hf_rotary(section, head_dim=2 * rotary_dim, factor=0.5)
    gen = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 5000, (3, 17), generator=gen)  # t, h, w all different
    cos_hf, sin_hf = module(torch.zeros(1, dtype=torch.float32), positions[:, None, :])
    cos, sin = rope_cos_sin(
        positions, rope_inv_freq(rotary_dim, 1e6), mrope_axis_map(section, True)
    )
    assert cos.shape == (17, rotary_dim)
    torch.testing.assert_close(cos, cos_hf[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(sin, sin_hf[0], rtol=0, atol=1e-5)
    # Text positions ([T]) are the same as three equal axes.
    text = rope_cos_sin(positions[0], rope_inv_freq(rotary_dim, 1e6), mrope_axis_map(section, True))
    same = rope_cos_sin(
        positions[0].expand(3, -1), rope_inv_freq(rotary_dim, 1e6), mrope_axis_map(section, True)
    )
    torch.testing.assert_close(text, same, rtol=0, atol=0)


def test_apply_rope_matches_transformers_partial_rotation():
    gen = torch.Generator().manual_seed(1)
    num_tokens, heads, head_dim, rotary_dim = 9, 3, 32, 8
    q = torch.randn(num_tokens, heads, head_dim, generator=gen)
    k = torch.randn(num_tokens, heads, head_dim, generator=gen)
    cos, sin = rope_cos_sin(
        torch.arange(100, 109), rope_inv_freq(rotary_dim, 1e4), mrope_axis_map((2, 1, 1), True)
    )
    q_hf, k_hf = hf.apply_rotary_pos_emb(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None]
    )
    torch.testing.assert_close(apply_rope(q, cos, sin), q_hf[0].transpose(0, 1))
    torch.testing.assert_close(apply_rope(k, cos, sin), k_hf[0].transpose(0, 1))
    assert torch.equal(apply_rope(q, cos, sin)[..., rotary_dim:], q[..., rotary_dim:])
