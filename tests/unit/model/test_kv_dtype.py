"""A quantized KV cache in the model (tiny random dense model, CPU, fp32 compute): logits of a
chunked prefill and of decode steps with each `--kv-dtype` against the unquantized cache, within
stated tolerances: relative error max |a - b| / max |b| over every logit row, and the share of rows
whose argmax agrees (this random model's top-2 margins are thin, so a few flips are expected).

Tolerances, about 2.5x what this model measured (int8 1.4e-3, fp8 7.8e-3, nvfp4 2.2e-2, k8v4
2.0e-2; argmax agreement 0.98 .. 1.0): int8 4e-3, fp8 2e-2, nvfp4 and k8v4 5e-2; agreement 0.9.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.config import TextConfig
from ninfer.model.qwen3_5 import Qwen3_5Model

PAGE_SIZE = 16
TOL = {"int8": 4e-3, "fp8": 2e-2, "nvfp4": 5e-2, "k8v4": 5e-2}
PROMPT, CHUNK, STEPS = 70, 32, 6


def _run(model: Qwen3_5Model, config: TextConfig, kv_dtype: str, ids: torch.Tensor) -> torch.Tensor:
    """Prefill the first PROMPT ids in chunks of CHUNK, then STEPS decode steps over the rest
    (teacher-forced, so both caches see the same tokens); every logit row [PROMPT + STEPS, V]."""
    cache = ModelCache.allocate(
        config, num_pages=16, num_slots=1, page_size=PAGE_SIZE, dtype=torch.float32,
        kv_dtype=kv_dtype,
    )  # fmt: skip
    pages = [11, 3, 7, 0, 14, 5]  # shuffled: contiguity is never assumed
    rows = []
    for start in range(0, PROMPT, CHUNK):
        chunk = ids[start : start + CHUNK]
        batch = ForwardBatch.prefill(chunk, num_computed=start, page_ids=pages, state_slot=0)
        rows.append(model.forward(batch, cache, all_logits=True))
    for i in range(STEPS):
        pos = PROMPT + i
        batch = ForwardBatch.decode(
            ids[pos : pos + 1], num_computed=[pos], page_tables=[pages], state_slots=[0]
        )
        rows.append(model.forward(batch, cache))
    return torch.cat(rows)


@pytest.fixture(scope="module")
def setup(tiny_dense):
    config = TextConfig.from_hf(tiny_dense.hf_config)
    model = Qwen3_5Model(config, tiny_dense.weights, dtype=torch.float32)
    ids = torch.randint(0, 512, (PROMPT + STEPS,), generator=torch.Generator().manual_seed(9))
    return model, config, ids, _run(model, config, "bf16", ids)


@pytest.mark.parametrize("kv_dtype", list(TOL))
def test_logits_against_the_unquantized_cache(setup, kv_dtype: str) -> None:
    model, config, ids, plain = setup
    got = _run(model, config, kv_dtype, ids)
    rel = ((got - plain).abs().max() / plain.abs().max()).item()
    agree = (got.argmax(-1) == plain.argmax(-1)).float().mean().item()
    assert rel <= TOL[kv_dtype], rel
    assert agree >= 0.9, agree
    assert rel > 0  # the cache really was quantized
