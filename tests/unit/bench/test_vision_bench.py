"""The vision benchmark's code path on CPU with tiny shapes (the real run needs a GPU)."""

from __future__ import annotations

import torch

from ninfer.bench.vision_bench import VISION_27B, run_vision_bench
from ninfer.model.config import TextConfig
from ninfer.model.qwen3_5 import Qwen3_5Model
from ninfer.testing import TinySpec
from ninfer.testing.tiny_config import tiny_config
from ninfer.testing.tiny_weights import TEXT_PREFIX, make_tensor, tensor_specs

TINY_VISION = {**VISION_27B, "depth": 1, "hidden_size": 32, "num_heads": 2,
               "intermediate_size": 32, "num_position_embeddings": 16}  # fmt: skip


def test_smoke_on_cpu_reports_tower_rows_and_ttft() -> None:
    spec = TinySpec(with_mtp=False, with_vision=False)
    weights = {
        t.name.removeprefix(TEXT_PREFIX): make_tensor(t, 0)
        for t in tensor_specs(spec)
        if t.name.startswith(TEXT_PREFIX) or t.name == "lm_head.weight"
    }
    model = Qwen3_5Model(TextConfig.from_hf(tiny_config(spec)), weights)
    report = run_vision_bench(
        device="cpu",
        image_size=64,
        batches=(1, 2),
        repeats=1,
        text_model=model,
        vision_config=TINY_VISION,
        dtype=torch.float32,
    )
    first, second = report["tower"]
    # 64 x 64 is below the default 65536-pixel minimum: resized to 256 x 256 -> 16 x 16 patches
    assert first["patches"] == 256 and first["merged_tokens"] == 64
    assert second["batch"] == 2 and second["images_per_s"] > 0
    ttft = report["ttft"]
    assert ttft["prompt_tokens"] == 64 + 64 + 2
    assert ttft["ttft_ms"] >= ttft["tower_ms"] and ttft["ttft_ms"] >= ttft["prefill_ms"]
