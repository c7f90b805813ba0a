"""Quantized KV in the engine (CPU): page copies and host snapshots move the scales with the
values, bit for bit; `--kv-capacity` and the host accounting count the quantized page's bytes; a
prefix-cache hit with a quantized KV equals the cold run with the same KV dtype, bit for bit (the
hit reads the stored, quantized rows the cold run also read, a copied tail page included)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from ninfer import Engine
from ninfer.artifact.demo import ensure_demo
from ninfer.engine.copies import CopyEngine
from ninfer.engine.handles import RequestHandle
from ninfer.engine.plan import PAGES, CopyOp
from ninfer.engine.request import EventKind
from ninfer.kernels.kv_quant.formats import QuantPages
from ninfer.model.cache import ModelCache
from ninfer.model.config import TextConfig

CONFIG = TextConfig.from_hf(
    {
        "vocab_size": 16,
        "hidden_size": 8,
        "num_hidden_layers": 2,
        "intermediate_size": 8,
        "layer_types": ["linear_attention", "full_attention"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "linear_num_key_heads": 1,
        "linear_num_value_heads": 2,
        "linear_key_head_dim": 4,
        "linear_value_head_dim": 3,
        "linear_conv_kernel_dim": 4,
        "rope_parameters": {"partial_rotary_factor": 0.5, "mrope_section": [4, 2, 2]},
    }
)


def _random_quant_cache(kv_dtype: str) -> ModelCache:
    cache = ModelCache.allocate(
        CONFIG, num_pages=8, num_slots=2, page_size=4, dtype=torch.bfloat16, kv_dtype=kv_dtype
    )
    g = torch.Generator().manual_seed(1)
    for t in cache.page_tensors():
        if t.dtype == torch.float32:
            t.copy_(torch.rand(t.shape, generator=g))
        else:
            t.copy_(torch.randint(0, 127, t.shape, generator=g).to(t.dtype))
    return cache


@pytest.mark.parametrize("kv_dtype", ["int8", "nvfp4", "k8v4"])
def test_page_copies_and_host_round_trip_carry_the_scales(kv_dtype: str) -> None:
    cache = _random_quant_cache(kv_dtype)
    assert isinstance(cache.k_pages[0], QuantPages) and cache.num_pages == 8
    tensors = cache.page_tensors()
    assert len(tensors) > 2  # values and scales
    assert sum(t.numel() * t.element_size() for t in tensors) == 8 * ModelCache.bytes_per_page(
        CONFIG, 4, torch.bfloat16, kv_dtype
    )

    def pages(ids: list[int]) -> list[torch.Tensor]:
        return [t[ids].clone() for t in cache.page_tensors()]

    def equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    engine = CopyEngine(cache, torch.device("cpu"))
    want = pages([1, 4, 6])
    engine.run([CopyOp(PAGES, (1,), (2,))])  # a copy-on-write tail page
    assert equal(pages([2]), pages([1]))
    engine.run([CopyOp(PAGES, (1, 4, 6), (7,), dst_host=True)])
    assert engine.host_bytes() == 3 * ModelCache.bytes_per_page(CONFIG, 4, torch.bfloat16, kv_dtype)
    for t in cache.page_tensors():
        t.zero_()
    engine.run([CopyOp(PAGES, (7,), (0, 5, 3), src_host=True)], free_host=[7])
    assert equal(pages([0, 5, 3]), want) and engine.host == {}


def test_quantized_pages_fit_more_tokens_in_the_same_bytes() -> None:
    plain = ModelCache.bytes_per_page(CONFIG, 64, torch.bfloat16)
    ratios = {
        k: plain / ModelCache.bytes_per_page(CONFIG, 64, torch.bfloat16, k)
        for k in ("int8", "fp8", "nvfp4", "k8v4")
    }
    # head dim 32: int8/fp8 rows 32 + 4 bytes against 64; nvfp4 16 + 2 + 4
    assert ratios == pytest.approx({"int8": 64 / 36, "fp8": 64 / 36, "nvfp4": 64 / 22,
                                    "k8v4": 128 / 58})  # fmt: skip


BASE = {"dtype": "fp32", "page_size": 16, "prefill_chunk": 16, "max_context": 256}


class Recorder:
    """An engine whose model forwards are recorded (every sampling row's logits, in order)."""

    def __init__(self, **options) -> None:
        self.engine = Engine.load(ensure_demo(), **BASE, **options)
        self.logits: list[torch.Tensor] = []
        forward = self.engine.model.forward

        def recording(batch, cache):
            out = forward(batch, cache)
            self.logits.append(out.detach().clone())
            return out

        self.engine.model.forward = recording  # type: ignore[method-assign]

    def run(self, ids: list[int], cut: int):
        self.logits = []
        request = self.engine.make_request(
            ids, max_tokens=6, ignore_eos=True, cache_checkpoints=(cut,), greedy=True
        )
        events = list(RequestHandle(self.engine.core, request))
        tokens = [t for e in events if e.kind == EventKind.TOKENS for t in e.token_ids]
        admitted = next(e for e in events if e.kind == EventKind.ADMITTED)
        return tokens, self.logits, admitted.num_cached


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[str, Recorder, Recorder]]:
    # k8v4 holds both 8-bit (fp8 K) and 4-bit (nvfp4 V) pages; int8 shares their store and copy
    # paths (one engine load costs ~6 s on the CPU)
    warm, cold = Recorder(kv_dtype="k8v4"), Recorder(kv_dtype="k8v4")
    yield "k8v4", warm, cold
    warm.engine.close()
    cold.engine.close()


def _ids(seed: int, n: int) -> list[int]:
    return torch.randint(0, 150_000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("cut", [32, 37])  # page-aligned, and mid-page (a copied tail page)
def test_prefix_hit_equals_the_cold_run_with_the_same_kv_dtype(engines, cut: int) -> None:
    kv_dtype, warm, cold = engines
    assert warm.engine.cache.kv_dtype == kv_dtype
    stem = _ids(cut, 50)
    second = stem[:cut] + _ids(100 + cut, 9)
    warm.run(stem, cut)
    tokens, logits, cached = warm.run(second, cut)
    assert cached == cut
    cold_tokens, cold_logits, cold_cached = cold.run(second, cut)
    assert cold_cached == 0
    assert tokens == cold_tokens
    assert len(logits) == len(cold_logits) == 6
    assert all(torch.equal(a, b) for a, b in zip(logits, cold_logits, strict=True))


def test_kv_capacity_auto_fits_more_tokens_with_a_quantized_kv(monkeypatch) -> None:
    """`--kv-capacity auto` on a (pretended) GPU with 80 GiB free, the 27B shape: the same budget
    divided by each dtype's page bytes, scales included."""
    from types import SimpleNamespace

    from ninfer.bench.synthetic import synthetic_config
    from ninfer.engine import build
    from ninfer.engine.options import EngineOptions

    config = synthetic_config("qwen3.6-27b")
    model = SimpleNamespace(device=torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (80 << 30, 141 << 30))
    pages = {}
    for kv_dtype in ("bf16", "int8", "fp8", "nvfp4", "k8v4"):
        options = EngineOptions(kv_capacity="auto", kv_dtype=kv_dtype)
        pages[kv_dtype] = build._num_pages(options, config, model, 2, torch.bfloat16)
    budget = pages["bf16"] * ModelCache.bytes_per_page(config, 64, torch.bfloat16)
    for kv_dtype, n in pages.items():
        page_bytes = ModelCache.bytes_per_page(config, 64, torch.bfloat16, kv_dtype)
        assert n == pytest.approx(budget / page_bytes, abs=n * 1e-3 + 1), kv_dtype
    assert pages["fp8"] == pages["int8"] and pages["fp8"] / pages["bf16"] == pytest.approx(
        65536 / 33280, rel=1e-3
    )
    assert pages["nvfp4"] > pages["k8v4"] > pages["fp8"]


def test_kv_capacity_auto_leaves_room_for_every_verify_column(monkeypatch) -> None:
    """With spec, a round's logits (and their penalized fp32 copies) have k + 1 columns per lane:
    `--kv-capacity auto` sets that much more aside, so a round captured after the KV pool was
    sized still fits (the 35B-A3B shape, 64 lanes, k = 5: ~1.4 GiB of verify logits)."""
    from types import SimpleNamespace

    from ninfer.bench.synthetic import synthetic_config
    from ninfer.engine import build
    from ninfer.engine.options import EngineOptions

    config = synthetic_config("qwen3.6-35b-a3b")
    model = SimpleNamespace(device=torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (60 << 30, 141 << 30))
    plain = EngineOptions(kv_capacity="auto", max_concurrency=64)
    spec = EngineOptions(kv_capacity="auto", max_concurrency=64, spec="mtp", draft_tokens=5)
    more = build.workspace_bytes(config, spec) - build.workspace_bytes(config, plain)
    assert more == 64 * 5 * config.vocab_size * 16
    page_bytes = ModelCache.bytes_per_page(config, 64, torch.bfloat16)
    fewer = build._num_pages(plain, config, model, 128, torch.bfloat16) - build._num_pages(
        spec, config, model, 128, torch.bfloat16, extra_layers=1
    )
    assert fewer * page_bytes >= more
