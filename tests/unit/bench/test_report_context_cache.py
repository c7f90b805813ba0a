"""The `--context-cache` part of a bench report: table line and JSON with the TTFT ratio."""

from __future__ import annotations

import json

from rich.console import Console

from ninfer.bench.report import print_report, to_json
from ninfer.bench.results import BenchReport, ContextCacheResult


def test_context_cache_section() -> None:
    report = BenchReport("qwen3.6-27b", 27_000_000_000, "NVIDIA H200", "2026-12-03", "2.13", "x")
    report.context_cache = ContextCacheResult(
        turn_tokens=16384, second_turn_prompt=16464, cached_tokens=16415,
        cold_ttft_ms=2000.0, warm_ttft_ms=50.0, same_output=True, snapshot_tokens=32768,
        snapshot_bytes=2 * 2**30, snapshot_ms=100.0, restore_ms=80.0,
        first_snapshot_ms=400.0, first_restore_ms=90.0,
    )  # fmt: skip
    data = json.loads(to_json(report))["context_cache"]
    assert data["ttft_ratio"] == 0.025 and data["cached_tokens"] == 16415
    console = Console(record=True, width=160)
    print_report(report, console)
    text = console.export_text()
    assert "2.5 %" in text and "100.0 + 80.0 ms" in text and "20.0 / 25.0 GiB/s" in text
