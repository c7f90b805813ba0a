"""The `--compare hf` part of a bench report: one row per HF cell, ninfer / HF, table and JSON."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from ninfer.bench.report import print_report, to_json
from ninfer.bench.results import (
    BenchReport,
    DecodeResult,
    HfComparison,
    LogitCheck,
    PrefillResult,
    comparison_rows,
)


def _report() -> BenchReport:
    report = BenchReport(
        model="qwen3.6-27b",
        num_params=26_900_000_000,
        device="NVIDIA H200",
        date="2026-12-02 18:00 UTC",
        torch_version="2.11.0",
        command="ninfer bench --synthetic qwen3.6-27b --compare hf",
    )
    report.prefill = [
        PrefillResult(512, 8192, 0.1, 5120.0, 100.0),
        PrefillResult(2048, 8192, 0.4, 5000.0, 400.0),
    ]
    report.decode = [
        DecodeResult(1, 1024, True, 16.0, 62.5),
        DecodeResult(8, 1024, True, 20.0, 400.0),
        DecodeResult(1, 1024, False, 50.0, 20.0),  # the eager baseline: not the compared row
    ]
    report.hf = HfComparison(
        transformers_version="5.17.0",
        attn_implementation="sdpa",
        decode_steps=8,
        prefill=[
            PrefillResult(2048, 2048, 0.5, 4000.0, 500.0),
            PrefillResult(4096, 4096, 1.0, 4096.0, 1000.0),
        ],
        decode=[
            DecodeResult(1, 1024, False, 125.0, 8.0),
            DecodeResult(8, 1024, False, 160.0, 50.0),
        ],
        logit_check=LogitCheck(2048, 16, 0.25, 30.0, 0.004, 1.0),
    )
    return report


def test_rows_pair_each_hf_cell_with_ninfer_graph_numbers() -> None:
    rows = comparison_rows(_report())
    assert [r.workload for r in rows] == [
        "prefill 2048 tokens",
        "prefill 4096 tokens",
        "decode batch 1 at 1024 context",
        "decode batch 8 at 1024 context",
    ]
    assert rows[0].ninfer_tok_per_s == 5000.0 and rows[0].ratio == pytest.approx(1.25)
    assert rows[1].ninfer_tok_per_s is None and rows[1].ratio is None  # ninfer did not run it
    assert rows[2].ninfer_tok_per_s == 62.5 and rows[2].ratio == pytest.approx(62.5 / 8.0)
    assert rows[3].ratio == pytest.approx(8.0)


def test_no_hf_part_no_rows() -> None:
    report = _report()
    report.hf = None
    assert comparison_rows(report) == []
    assert "compare_hf" not in json.loads(to_json(report))


def test_table_shows_both_numbers_and_the_ratio() -> None:
    console = Console(record=True, width=200)
    print_report(_report(), console)
    text = console.export_text()
    assert "ninfer vs HF transformers 5.17.0" in text
    assert "ninfer / HF" in text
    line = next(li for li in text.splitlines() if "decode batch 1 at 1024 context" in li)
    assert "62.5" in line and "8.0" in line and "7.8x" in line
    line = next(li for li in text.splitlines() if "prefill 4096 tokens" in li)
    assert "4,096.0" in line and "x" not in line.split("4,096.0")[1]
    assert "logit check" in text and "not a benchmark" in text and "100%" in text


def test_json_carries_the_hf_run_and_the_rows() -> None:
    data = json.loads(to_json(_report()))
    assert data["hf"]["transformers_version"] == "5.17.0"
    assert data["hf"]["logit_check"]["max_abs_diff"] == 0.25
    rows = {r["workload"]: r for r in data["compare_hf"]}
    assert rows["decode batch 8 at 1024 context"] == {
        "workload": "decode batch 8 at 1024 context",
        "ninfer_tok_per_s": 400.0,
        "hf_tok_per_s": 50.0,
        "ratio": 8.0,
    }
