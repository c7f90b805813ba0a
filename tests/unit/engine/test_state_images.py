"""StateImages and the copy engine: the device image slots beyond the lanes, the host pool they
spill to (one byte budget, shared with host KV), refcounts, LRU stamps and the integrity check;
and the runner's copies on a real ModelCache (random contents): every capture, spill, restore
and KV page transfer reproduces its source bit for bit."""

from __future__ import annotations

import pytest
import torch

from ninfer.engine.copies import CopyEngine
from ninfer.engine.plan import PAGES, STATE, CopyOp
from ninfer.engine.state_images import HostPool, StateImages
from ninfer.model.cache import ModelCache
from ninfer.model.config import TextConfig

CONFIG = TextConfig.from_hf(
    {
        "vocab_size": 16,
        "hidden_size": 8,
        "num_hidden_layers": 4,
        "intermediate_size": 8,
        "layer_types": [
            "linear_attention",
            "full_attention",
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
LANES, EXTRA = 2, 2
IMAGE = 100  # bytes per image for the accounting tests


def test_capture_fills_device_slots_then_the_host_and_release_returns_them() -> None:
    host = HostPool(2 * IMAGE + 50)
    images = StateImages(range(LANES, LANES + EXTRA), host, IMAGE)
    ops: list[CopyOp] = []
    a = images.capture(0, ops)
    b = images.capture(1, ops)
    assert a is not None and b is not None and {a.slot, b.slot} == {2, 3}
    assert images.num_free == 0
    c = images.capture(0, ops)  # no device slot left: the host takes it
    assert c is not None and c.slot is None and c.block is not None
    d = images.capture(1, ops)
    assert d is not None and host.used == 2 * IMAGE
    assert images.capture(0, ops) is None  # the budget holds two images, not three
    assert ops == [
        CopyOp(STATE, (0,), (a.slot,)),
        CopyOp(STATE, (1,), (b.slot,)),
        CopyOp(STATE, (0,), (c.block,), dst_host=True),
        CopyOp(STATE, (1,), (d.block,), dst_host=True),
    ]
    images.check_integrity([a, b, c, d])
    host.check_integrity([c.block, d.block])
    free_host: list[int] = []
    images.release(c, free_host)
    assert free_host == [c.block] and host.used == IMAGE
    images.retain(a)
    images.release(a, free_host)
    assert images.num_free == 0  # a still has one reference
    images.release(a, free_host)
    assert images.num_free == 1
    images.check_integrity([b, d])


def test_spill_moves_an_image_to_the_host_and_restore_reads_it_there() -> None:
    host = HostPool(IMAGE)
    images = StateImages([5], host, IMAGE)
    ops: list[CopyOp] = []
    a = images.capture(0, ops)
    assert a is not None and a.slot == 5
    before = a.last_used
    assert images.spill(a, ops) and a.slot is None and images.num_free == 1
    b = images.capture(1, ops)
    assert b is not None and b.slot == 5
    assert not images.spill(b, ops)  # the host is full: the image stays where it is
    images.restore(a, 1, ops)
    assert a.last_used > before  # a restore counts as a use (LRU)
    assert ops[1] == CopyOp(STATE, (5,), (a.block,), dst_host=True)
    assert ops[-1] == CopyOp(STATE, (a.block,), (1,), src_host=True)
    assert images.num_spills == 1 and images.num_restores == 1


def test_integrity_catches_a_leak_and_a_wrong_refcount() -> None:
    images = StateImages([2, 3], HostPool(0), IMAGE)
    a = images.capture(0, [])
    assert a is not None
    with pytest.raises(AssertionError):
        images.check_integrity([])  # a live image nobody owns
    images.retain(a)
    with pytest.raises(AssertionError):
        images.check_integrity([a])  # two references, one owner
    images.check_integrity([a, a])
    host = HostPool(10)
    block = host.allocate(4)
    with pytest.raises(AssertionError):
        host.check_integrity([])
    assert block is not None
    host.check_integrity([block])


# -- the copy engine on real buffers ---------------------------------------------------------


def _random_cache(seed: int) -> ModelCache:
    cache = ModelCache.allocate(
        CONFIG, num_pages=8, num_slots=LANES + EXTRA, page_size=4, dtype=torch.bfloat16
    )
    g = torch.Generator().manual_seed(seed)
    for t in [*cache.k_pages, *cache.v_pages, *cache.conv_state, *cache.ssm_state]:
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    return cache


def _state(cache: ModelCache, slot: int) -> list[torch.Tensor]:
    return [t[slot].clone() for t in [*cache.conv_state, *cache.ssm_state]]


def _pages(cache: ModelCache, pages: list[int]) -> list[torch.Tensor]:
    return [t[pages].clone() for t in [*cache.k_pages, *cache.v_pages]]


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_state_capture_spill_and_restore_are_exact() -> None:
    cache = _random_cache(1)
    engine = CopyEngine(cache, torch.device("cpu"))
    host = HostPool(10 * ModelCache.bytes_per_slot(CONFIG, torch.bfloat16))
    images = StateImages([2, 3], host, ModelCache.bytes_per_slot(CONFIG, torch.bfloat16))
    want0, want1 = _state(cache, 0), _state(cache, 1)
    ops: list[CopyOp] = []
    a = images.capture(0, ops)
    engine.run(ops)
    assert a is not None and _equal(_state(cache, a.slot), want0)
    ops = []
    assert images.spill(a, ops)
    b = images.capture(1, ops, device=False)  # straight to the host (a pause snapshot)
    engine.run(ops)
    assert engine.host_bytes() == host.used  # the accounting matches the bytes held
    cache.reset_slot(0)
    cache.reset_slot(1)
    ops = []
    assert b is not None
    images.restore(a, 1, ops)
    images.restore(b, 0, ops)
    engine.run(ops)
    assert _equal(_state(cache, 1), want0) and _equal(_state(cache, 0), want1)
    free_host: list[int] = []
    images.release(a, free_host)
    images.release(b, free_host)
    engine.run([], free_host)
    assert engine.host == {} and host.used == 0
    images.check_integrity([])


def test_kv_page_copies_and_host_round_trip_are_exact() -> None:
    cache = _random_cache(2)
    engine = CopyEngine(cache, torch.device("cpu"))
    want = _pages(cache, [1, 4, 6])
    engine.run([CopyOp(PAGES, (1, 4), (2, 3))])  # a tail-page copy is the one-page case
    assert _equal(_pages(cache, [2, 3]), _pages(cache, [1, 4]))
    engine.run([CopyOp(PAGES, (1, 4, 6), (7,), dst_host=True)])
    host_bytes = 3 * ModelCache.bytes_per_page(CONFIG, 4, torch.bfloat16)
    assert engine.host_bytes() == host_bytes
    for t in [*cache.k_pages, *cache.v_pages]:
        t.zero_()
    engine.run([CopyOp(PAGES, (7,), (0, 5, 2), src_host=True)], free_host=[7])
    assert _equal(_pages(cache, [0, 5, 2]), want) and engine.host == {}
