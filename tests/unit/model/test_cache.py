"""ModelCache buffers: layout per layer kind, slot reset and copy."""

from __future__ import annotations

import pytest
import torch

from ninfer.model.cache import ModelCache
from ninfer.model.config import TextConfig
from ninfer.model.errors import BatchError

CONFIG = TextConfig.from_hf(
    {
        "vocab_size": 16,
        "hidden_size": 8,
        "num_hidden_layers": 5,
        "intermediate_size": 8,
        "layer_types": [
            "linear_attention",
            "full_attention",
            "linear_attention",
            "linear_attention",
            "full_attention",
        ],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 4,
        "linear_value_head_dim": 3,
        "linear_conv_kernel_dim": 4,
        "rope_parameters": {"partial_rotary_factor": 0.5, "mrope_section": [1, 1, 0]},
    }
)


def allocate(**kw):
    args = {"num_pages": 6, "num_slots": 3, "page_size": 4, "dtype": torch.bfloat16} | kw
    return ModelCache.allocate(CONFIG, **args)


def test_layout_per_layer_kind():
    cache = allocate()
    assert len(cache.k_pages) == 2 and len(cache.ssm_state) == 3
    k, v = cache.kv(4)
    assert k is cache.k_pages[1] and v is cache.v_pages[1]
    assert k.shape == (6, 4, 2, 8) and k.dtype == torch.bfloat16
    conv, ssm = cache.state(3)
    assert conv is cache.conv_state[2]
    assert conv.shape == (3, 2 * 4 + 2 * 3, 3) and conv.dtype == torch.bfloat16
    assert ssm.shape == (3, 2, 4, 3) and ssm.dtype == torch.float32
    assert (cache.num_pages, cache.num_slots, cache.page_size) == (6, 3, 4)
    assert all(t.abs().sum() == 0 for t in cache.k_pages + cache.v_pages + cache.ssm_state)


def test_reset_and_copy_slot_touch_only_their_slots():
    cache = allocate()
    for t in cache.conv_state + cache.ssm_state:
        t.copy_(torch.randn(t.shape))
    before = [t.clone() for t in cache.conv_state + cache.ssm_state]
    cache.copy_slot(0, 2)
    cache.reset_slot(1)
    for t, old in zip(cache.conv_state + cache.ssm_state, before, strict=True):
        assert torch.equal(t[0], old[0])
        assert torch.equal(t[2], old[0])
        assert t[1].abs().sum() == 0


def test_bad_slots_and_sizes():
    cache = allocate()
    with pytest.raises(BatchError, match="state slot 3 out of range"):
        cache.reset_slot(3)
    with pytest.raises(BatchError, match="state slot -1"):
        cache.copy_slot(-1, 0)
    with pytest.raises(ValueError, match="must be > 0"):
        allocate(num_pages=0)
