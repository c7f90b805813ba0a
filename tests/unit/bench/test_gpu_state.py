"""The bench's read-only GPU state probe: parsing nvidia-smi's CSV, the command it runs, and the
report lines (CPU; nvidia-smi is faked)."""

from __future__ import annotations

import json
import subprocess

import pytest
from rich.console import Console

from ninfer.bench import gpu_state
from ninfer.bench.report import print_report, to_json
from ninfer.bench.results import BenchReport

LINE = "1755, 1980, 3201, 688.41, 700.00, 71, 0x0000000000000004"


def test_parse_reads_the_fields_and_names_the_reasons() -> None:
    state = gpu_state.parse(LINE)
    assert state is not None
    assert (state.sm_mhz, state.max_sm_mhz, state.mem_mhz) == (1755, 1980, 3201)
    assert (state.power_w, state.power_limit_w, state.temperature_c) == (688.41, 700, 71)
    assert state.reasons == 4 and state.reason_names == ["SW power cap"]
    text = state.describe()
    assert "SM 1755 of 1980 MHz" in text and "688 of 700 W" in text and "SW power cap" in text
    assert gpu_state.parse(LINE.replace("0x0000000000000004", "0x44")).reason_names == [
        "SW power cap",
        "HW thermal",
    ]
    assert "reasons: none" in gpu_state.parse(LINE.replace("0x0000000000000004", "0")).describe()


@pytest.mark.parametrize(
    "line", ["", "1755, 1980", "[N/A], 1980, 3201, 688.41, 700.00, 71, 0x0", LINE + ", 5"]
)
def test_parse_refuses_what_it_cannot_read(line: str) -> None:
    assert gpu_state.parse(line) is None


def test_query_only_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command is a query of the named GPU and nothing else; its answer is parsed."""
    seen: list[list[str]] = []

    def fake_run(cmd, **kw):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout=LINE + "\n", stderr="")

    monkeypatch.setattr(gpu_state.shutil, "which", lambda name: "/bin/nvidia-smi")
    monkeypatch.setattr(gpu_state.subprocess, "run", fake_run)
    state = gpu_state.query("1234-abcd")
    assert state is not None and state.sm_mhz == 1755
    (cmd,) = seen
    assert cmd[1].startswith("--query-gpu=clocks.sm,") and cmd[2] == "--format=csv,noheader,nounits"
    assert cmd[3:] == ["-i", "GPU-1234-abcd"]
    gpu_state.query("GPU-1234-abcd")
    assert seen[-1][3:] == ["-i", "GPU-1234-abcd"]


def test_query_without_nvidia_smi_or_with_a_failing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_state.shutil, "which", lambda name: None)
    assert gpu_state.query() is None
    monkeypatch.setattr(gpu_state.shutil, "which", lambda name: "/bin/nvidia-smi")

    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 9, stdout="", stderr="No devices were found")

    monkeypatch.setattr(gpu_state.subprocess, "run", failing)
    assert gpu_state.query() is None

    def old_driver(cmd, **kw):  # knows only the older name of the reasons field
        ok = "clocks_throttle_reasons.active" in cmd[1]
        return subprocess.CompletedProcess(cmd, 0 if ok else 2, stdout=LINE if ok else "")

    monkeypatch.setattr(gpu_state.subprocess, "run", old_driver)
    assert gpu_state.query().reason_names == ["SW power cap"]

    def hanging(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw.get("timeout", 5))

    monkeypatch.setattr(gpu_state.subprocess, "run", hanging)
    assert gpu_state.query() is None


def test_report_lines_and_json() -> None:
    report = BenchReport("qwen3.6-27b", 27_000_000_000, "NVIDIA H200", "2026-12-03", "2.13", "x")
    report.gpu_start = gpu_state.parse(LINE.replace("0x0000000000000004", "0x1"))
    report.gpu_end = gpu_state.parse(LINE)
    console = Console(record=True, width=200)
    print_report(report, console)
    text = console.export_text()
    assert "GPU before the matrix: SM 1755 of 1980 MHz" in text and "reasons: idle" in text
    assert "GPU after the matrix:" in text and "SW power cap" in text
    data = json.loads(to_json(report))
    assert data["gpu_end"]["power_w"] == 688.41 and data["gpu_start"]["reasons"] == 1
