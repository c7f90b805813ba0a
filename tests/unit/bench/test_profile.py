"""Step profiles: aggregation arithmetic, and an eager decode step profiled on the CPU."""

from __future__ import annotations

import pytest
import torch

from ninfer.artifact.schema import text_tensors
from ninfer.bench.model_bench import ModelBench
from ninfer.bench.profile import is_matmul, summarize
from ninfer.model.config import TextConfig
from ninfer.model.qwen3_5 import Qwen3_5Model

TINY = {
    "model_type": "qwen3_5_text",
    "vocab_size": 512,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "intermediate_size": 128,
    "rope_parameters": {
        "rope_type": "default",
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
    },
}


def test_summarize_splits_matmuls_and_ranks_kernels() -> None:
    events = [
        ("sm90_xmma_gemm_bf16bf16_bf16f32", 8, 600.0),
        ("void at::native::elementwise_kernel<128, 4>", 40, 300.0),
        ("gemv2T_kernel_val<int, int, float>", 4, 100.0),
        ("idle", 2, 0.0),  # no device time: dropped
    ]
    p = summarize(events, 2, batch=3, context=99, top=2)
    assert (p.batch, p.context) == (3, 99)
    assert p.kernel_us == pytest.approx(500.0)  # (600 + 300 + 100) / 2 steps
    assert p.matmul_us == pytest.approx(350.0)
    assert p.num_kernels == pytest.approx(26.0)
    assert [k.name for k in p.top] == [events[0][0], events[1][0]]
    assert p.top[0].share == pytest.approx(0.6) and p.top[1].calls_per_step == 20


@pytest.mark.parametrize(
    "name,expected",
    [("ampere_bf16_s16816gemm", True), ("cutlass::Kernel2<x>", True), ("rms_norm", False)],
)
def test_matmul_names(name: str, expected: bool) -> None:
    assert is_matmul(name) is expected


def test_profile_of_an_eager_cpu_decode_step() -> None:
    config = TextConfig.from_hf(TINY)
    g = torch.Generator().manual_seed(0)
    weights = {n: torch.randn(s, generator=g) * 0.1 for n, s in text_tensors(dict(TINY)).items()}
    model = Qwen3_5Model(config, weights, dtype=torch.float32, device="cpu")
    bench = ModelBench(model, max_batch=2, max_seq_tokens=200, max_total_tokens=300)
    assert bench.graphs is None and "not a CUDA device" in (bench.graphs_reason or "")
    p = bench.profile_decode(2, 100, steps=2)
    assert p.kernel_us > 0 and p.num_kernels > 10
    assert sum(k.share for k in p.top) <= 1.0 + 1e-9
    assert any("linear" in k.name or "mm" in k.name for k in p.top)
    # the torch matmuls by input shape: the MLP's merged gate-up [2, 64] @ [64, 256] is one
    hidden, inter = TINY["hidden_size"], TINY["intermediate_size"]
    shapes = {m.shape for m in p.matmuls}
    assert f"2 x {hidden} @ {hidden} x {2 * inter}" in shapes, shapes
    assert all(m.tflops > 0 and m.calls_per_step > 0 for m in p.matmuls)


def test_matmul_shapes_and_their_rates() -> None:
    """(op, input shapes, calls, µs) rows: shapes read per op, 2 M N K per call over the time,
    per step; ops that are no matmul, malformed shapes and zero times are dropped."""
    rows = [
        ("aten::mm", [[8192, 6144], [6144, 5120]], 48, 96_000.0),
        ("aten::addmm", [[5120], [8192, 5120], [5120, 34816]], 64, 483_000.0),
        ("aten::bmm", [[4, 16, 32], [4, 32, 8]], 2, 10.0),
        ("aten::add", [[8192, 5120], [8192, 5120]], 5, 50.0),
        ("aten::mm", [[3, 4], [5, 6]], 1, 1.0),  # K mismatch
        ("aten::mm", [[2, 2], [2, 2]], 1, 0.0),
    ]
    p = summarize([("nvjet_x", 112, 579_000.0)], 2, batch=1, context=8192, shapes=rows)
    assert [m.op for m in p.matmuls] == ["aten::addmm", "aten::mm", "aten::bmm"]
    top, out_proj, bmm = p.matmuls
    assert top.shape == "8192 x 5120 @ 5120 x 34816" and top.calls_per_step == 32
    assert top.us_per_step == pytest.approx(241_500.0)
    assert top.tflops == pytest.approx(2 * 8192 * 5120 * 34816 * 64 / 483_000.0 / 1e6)
    assert out_proj.shape == "8192 x 6144 @ 6144 x 5120"
    assert out_proj.tflops == pytest.approx(2 * 8192 * 6144 * 5120 * 48 / 96_000.0 / 1e6)
    assert bmm.shape == "4 x 16 x 32 @ 32 x 8" and bmm.tflops == pytest.approx(
        2 * 4 * 16 * 8 * 32 * 2 / 10.0 / 1e6
    )
    assert len(summarize([], 1, batch=1, context=1, shapes=rows, top_shapes=1).matmuls) == 1


def test_the_report_prints_the_matmul_shapes() -> None:
    from rich.console import Console

    from ninfer.bench.report import print_report
    from ninfer.bench.results import BenchReport

    rows = [("aten::mm", [[8192, 6144], [6144, 5120]], 48, 96_000.0)]
    report = BenchReport("qwen3.6-27b", 27_000_000_000, "NVIDIA H200", "2026-12-03", "2.13", "x")
    report.prefill_profile = summarize(
        [("nvjet_x", 48, 96_000.0)], 1, batch=1, context=8192, kind="prefill", shapes=rows
    )
    console = Console(record=True, width=200)
    print_report(report, console)
    text = console.export_text()
    assert "torch matmuls by shape" in text and "8192 x 6144 @ 6144 x 5120" in text
    assert f"{2 * 8192 * 6144 * 5120 * 48 / 96_000.0 / 1e6:.0f}" in text  # its TFLOP/s
