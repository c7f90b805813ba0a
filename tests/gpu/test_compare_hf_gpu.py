"""`ninfer bench --compare hf` end to end on the GPU, on the tiny synthetic shapes.

Needs transformers with qwen3_5 (5.17 on the device machine). The HF model must hold no weight
memory of its own, both models must agree on the prefill logits up to bf16 rounding (a wrong
name or shape mapping gives unrelated logits: relative L2 near 1.4), and every HF cell must come
back with ninfer's number beside it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("transformers")

from ninfer.bench.hf_compare import build_hf_model  # noqa: E402
from ninfer.bench.results import comparison_rows  # noqa: E402
from ninfer.bench.run import BenchOptions, run_bench  # noqa: E402
from ninfer.bench.synthetic import random_weights, synthetic_config, synthetic_hf_config  # noqa: E402
from ninfer.cli.app import app  # noqa: E402
from ninfer.model.qwen3_5 import Qwen3_5Model  # noqa: E402

pytestmark = pytest.mark.gpu

SMALL = [
    "--no-kernels",
    "--no-ceilings",
    "--prefill",
    "64,256",
    "--batches",
    "1,2",
    "--contexts",
    "128",
    "--steps",
    "4",
]


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_hf_model_holds_no_weight_memory_of_its_own(name: str) -> None:
    weights = random_weights(name, device="cuda:0", seed=3)
    model = Qwen3_5Model(synthetic_config(name), weights, dtype=torch.bfloat16, device="cuda:0")
    del weights
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    hf = build_hf_model(model, synthetic_hf_config(name))
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before < 2**20  # the rotary inv_freq buffers only
    assert all(p.device.type == "cuda" for p in hf.parameters())


def test_compare_hf_cli_end_to_end_dense(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["bench", "--synthetic", "tiny-dense", *SMALL, "--compare", "hf"]
    args += ["--hf-prefill", "256", "--hf-batches", "1,2", "--hf-steps", "3", "--save", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "ninfer / HF" in result.output and "logit check" in result.output
    data = json.loads(out.read_text())
    rows = {r["workload"]: r for r in data["compare_hf"]}
    assert set(rows) == {
        "prefill 256 tokens",
        "decode batch 1 at 128 context",
        "decode batch 2 at 128 context",
    }
    for row in rows.values():
        assert row["hf_tok_per_s"] > 0 and row["ninfer_tok_per_s"] > 0
        assert row["ratio"] == pytest.approx(row["ninfer_tok_per_s"] / row["hf_tok_per_s"])
    check = data["hf"]["logit_check"]
    assert check["num_tokens"] == 256 and check["num_positions"] == 16
    assert check["rel_l2"] < 0.1 and check["argmax_agree"] >= 0.5


def test_compare_hf_moe_widens_the_ninfer_matrix() -> None:
    messages: list[str] = []
    opts = BenchOptions(
        synthetic="tiny-moe",
        prefill_sizes=(64,),
        decode_batches=(1,),
        decode_contexts=(128,),
        decode_steps=4,
        kernels=False,
        ceilings=False,
        compare="hf",
        hf_prefill_sizes=(192,),
        hf_decode_batches=(1, 3),
        hf_decode_steps=3,
    )
    report = run_bench(opts, messages.append)
    assert [p.num_tokens for p in report.prefill] == [64, 192]  # HF's 192 added
    assert {d.batch for d in report.decode} == {1, 3}  # HF's batch 3 added
    rows = comparison_rows(report)
    assert len(rows) == 3 and all(r.ratio is not None and r.ratio > 0 for r in rows)
    assert report.hf is not None and report.hf.logit_check is not None
    assert report.hf.logit_check.rel_l2 < 0.1
    assert report.hf.peak_memory_gib > 0
    assert any(m.startswith("HF decode batch 3") for m in messages)
