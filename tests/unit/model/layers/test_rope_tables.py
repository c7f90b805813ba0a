"""`Rope`, the doubled tables the model steps read, against `rope_cos_sin` bit for bit (CPU and
GPU: the GPU's int64-times-fp32 multiply must cast as `.float()` does)."""

from __future__ import annotations

import pytest
import torch

from ninfer.model.layers.rope import Rope, mrope_axis_map, rope_cos_sin, rope_inv_freq

DEVICES = [
    pytest.param("cpu"),
    pytest.param("cuda", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("theta,rotary_dim,section", [(1e7, 64, (11, 11, 10)), (1e4, 8, (2, 1, 1))])
def test_rope_tables_give_rope_cos_sin_bit_for_bit(device, theta, rotary_dim, section):
    """`Rope` (the doubled tables the model steps read) against the definition, for text
    positions (a strided column, as the graph steps stage them) and MRoPE positions, up to the
    family's 262,144-token context."""
    inv_freq = rope_inv_freq(rotary_dim, theta, device)
    axis_map = mrope_axis_map(section, True, device)
    rope = Rope(inv_freq, axis_map)
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    staged = torch.randint(0, 262_144, (33, 4), generator=gen).to(device)
    text = staged[:, 2]
    assert not text.is_contiguous()
    mrope = torch.randint(0, 262_144, (3, 33), generator=gen).to(device)
    for positions in (text, mrope, text.contiguous()[:1]):
        got = rope.cos_sin(positions)
        want = rope_cos_sin(positions, inv_freq, axis_map)
        assert got[0].dtype == torch.float32 and got[0].shape == (positions.shape[-1], rotary_dim)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
