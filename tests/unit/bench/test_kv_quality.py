"""`ninfer bench --kv-dtype-quality` on the CPU with the tiny synthetic model: one row per
(context, KV dtype), agreement in [0, 1], a positive finite KL (the cache really was quantized),
and int8 (8-bit codes on a uniform grid) closer to bf16 than nvfp4 (4-bit codes)."""

from __future__ import annotations

import math

import torch

from ninfer.bench.kv_quality import run_kv_quality
from ninfer.bench.synthetic import random_weights, synthetic_config
from ninfer.model.qwen3_5 import Qwen3_5Model


def test_quality_rows_per_context_and_dtype() -> None:
    config = synthetic_config("tiny-dense")
    weights = random_weights("tiny-dense", device="cpu", dtype=torch.float32, seed=1)
    model = Qwen3_5Model(config, weights, dtype=torch.float32)
    rows = run_kv_quality(
        model, contexts=(96,), query_tokens=16, decode_steps=3, chunk=64, time_decode=False
    )
    assert [(r.context, r.kv_dtype) for r in rows] == [
        (96, k) for k in ("int8", "fp8", "nvfp4", "k8v4")
    ]
    for r in rows:
        assert 0.0 <= r.prefill_top1 <= 1.0 and 0.0 <= r.decode_top1 <= 1.0
        assert 0.0 < r.prefill_kl < 1.0 and math.isfinite(r.decode_kl), r
        assert r.decode_tok_s is None
    by = {r.kv_dtype: r for r in rows}
    assert by["int8"].prefill_kl < by["nvfp4"].prefill_kl
    bytes_per_token = {k: r.kv_bytes_per_token for k, r in by.items()}
    assert bytes_per_token["nvfp4"] < bytes_per_token["k8v4"] < bytes_per_token["fp8"]
    assert bytes_per_token["fp8"] == bytes_per_token["int8"]
