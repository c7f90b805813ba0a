"""The bench's model driver on a tiny converted model: timings come back sane, graphs or not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ninfer.artifact.reader import Artifact
from ninfer.bench.model_bench import ModelBench, run_matrix
from ninfer.model.config import TextConfig
from ninfer.model.qwen3_5 import Qwen3_5Model

pytestmark = pytest.mark.gpu


def test_model_bench_matrix_on_a_tiny_model(dense_artifact: Path) -> None:
    with Artifact(dense_artifact) as art:
        config = TextConfig.from_hf(art.config["text"])
        model = Qwen3_5Model(config, art.load("text"), dtype=torch.bfloat16, device="cuda:0")
    bench = ModelBench(model, max_batch=4, max_seq_tokens=600, max_total_tokens=4 * 100)
    assert bench.graphs is not None
    messages: list[str] = []
    prefills, decodes = run_matrix(
        bench,
        prefill_sizes=(64, 300),
        prefill_chunk=128,
        decode_batches=(1, 4),
        decode_contexts=(64, 500),
        decode_steps=4,
        eager_baseline=True,
        on_progress=messages.append,
    )
    assert [p.num_tokens for p in prefills] == [64, 300]
    assert all(p.tok_per_s > 0 and p.ttft_ms > 0 for p in prefills)
    cells = [(d.batch, d.context, d.graphs) for d in decodes]
    assert cells == [(1, 64, True), (4, 64, True), (1, 500, True), (1, 64, False)]
    assert all(d.tok_per_s == pytest.approx(d.batch / (d.step_ms / 1000)) for d in decodes)
    assert bench.graphs.num_captured == 3  # (1, 64-ctx width), (4, same width), (1, wider)
    assert messages[0] == "prefill warm-up"


def test_gpu_state_of_the_device_in_use() -> None:
    """Where nvidia-smi answers, the probe reads the GPU torch uses (by UUID): a running SM
    clock no higher than its maximum, a power draw under its limit plus slack."""
    import shutil

    from ninfer.bench import gpu_state

    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi on this machine")
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    state = gpu_state.query(uuid)
    assert state is not None
    assert 0 < state.sm_mhz <= state.max_sm_mhz and state.power_w < 1.2 * state.power_limit_w
