"""`ninfer bench --ab`: settings parsed and checked without a GPU, the environment restored, the
A/B table built from the report (the GPU part, recapture and decode, runs in device calls)."""

from __future__ import annotations

import os

import pytest
from rich.console import Console

from ninfer.bench.ab import AbSettingError, parse_settings
from ninfer.bench.report import print_report
from ninfer.bench.results import AbResult, BenchReport, DecodeResult
from ninfer.kernels.switches import setting as environment


def test_settings_split_on_semicolons_and_keep_commas() -> None:
    got = parse_settings(" NINFER_KERNELS_OFF=fp8_ring,pdl ; NINFER_KERNELS_ON=bf16_tc_gemv;")
    assert got == (("NINFER_KERNELS_OFF", "fp8_ring,pdl"), ("NINFER_KERNELS_ON", "bf16_tc_gemv"))
    assert parse_settings("") == ()


@pytest.mark.parametrize("bad", ["NINFER_KERNELS_OFF", "PATH=/tmp", "NINFER_=x", "=x"])
def test_bad_settings_are_refused(bad: str) -> None:
    with pytest.raises(AbSettingError, match="NAME=VALUE"):
        parse_settings(bad)


def test_environment_is_restored(monkeypatch) -> None:
    monkeypatch.setenv("NINFER_KERNELS_OFF", "pdl")
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    with environment("NINFER_KERNELS_OFF", "fp8_ring"), environment("NINFER_KERNELS_ON", "x"):
        assert os.environ["NINFER_KERNELS_OFF"] == "fp8_ring"
        assert os.environ["NINFER_KERNELS_ON"] == "x"
    assert os.environ["NINFER_KERNELS_OFF"] == "pdl"
    assert "NINFER_KERNELS_ON" not in os.environ
    with pytest.raises(RuntimeError), environment("NINFER_KERNELS_ON", "y"):
        raise RuntimeError
    assert "NINFER_KERNELS_ON" not in os.environ


def _row(batch: int, ms: float) -> DecodeResult:
    return DecodeResult(batch, 1024, True, ms, batch / ms * 1e3)


def test_ab_table_gives_ratios_to_the_median_base() -> None:
    report = BenchReport("qwen3.6-27b", 1, "GPU", "today", "torch", "ninfer bench")
    report.decode = [_row(1, 10.0), _row(8, 20.0), DecodeResult(1, 1024, False, 70.0, 14.0)]
    report.ab = [
        AbResult("NINFER_KERNELS_OFF=fp8_ring", [_row(1, 11.0), _row(8, 19.0)]),
        AbResult("", [_row(1, 12.0), _row(8, 20.0)]),
    ]
    console = Console(record=True, width=200)
    print_report(report, console)
    text = console.export_text()
    assert "NINFER_KERNELS_OFF=fp8_ring" in text
    assert "11.000 (2)" in text and "18.2 %" in text  # base median of 10 and 12; spread 2 / 11
    assert "11.000 (1.000) ≈" in text  # within the base's spread
    assert "19.000 (0.950)" in text and "0.950) ≈" not in text  # base 20 and 20: no spread


def test_ab_rounds_take_medians_per_side() -> None:
    """Two rounds: each setting timed twice, the base three times (the matrix's and two
    re-timings); the table gives medians, the base's spread, and marks what lies within it."""
    report = BenchReport("qwen3.6-27b", 1, "GPU", "today", "torch", "ninfer bench")
    report.decode = [_row(8, 21.0)]
    a, b = "NINFER_KERNELS_ON=a", "NINFER_KERNELS_ON=b"
    report.ab = [
        AbResult(a, [_row(8, 20.0)]),
        AbResult(b, [_row(8, 21.1)]),
        AbResult("", [_row(8, 21.2)]),
        AbResult(a, [_row(8, 20.2)]),
        AbResult(b, [_row(8, 20.9)]),
        AbResult("", [_row(8, 21.4)]),
    ]
    console = Console(record=True, width=240)
    print_report(report, console)
    text = console.export_text()
    assert "21.200 (3)" in text and "1.9 %" in text  # median of 21.0, 21.2, 21.4; 0.4 / 21.2
    assert "20.100 (0.948)" in text and "0.948) ≈" not in text  # a: outside the spread
    assert "21.000 (0.991) ≈" in text  # b: within it
    assert text.count("NINFER_KERNELS_ON=a") == 1  # one column per setting


@pytest.mark.gpu
def test_ab_run_on_the_tiny_model_restores_the_switches(monkeypatch) -> None:
    """The whole path on a GPU: settings applied to recaptured graphs, rows for every batch, the
    base re-timed, and the environment as it was afterwards."""
    from ninfer.bench.run import BenchOptions, run_bench

    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    opts = BenchOptions(
        synthetic="tiny-dense",
        prefill_sizes=(64,),
        decode_batches=(1, 2),
        decode_contexts=(128,),
        decode_steps=2,
        kernels=False,
        ceilings=False,
        eager_baseline=False,
        ab=(("NINFER_KERNELS_OFF", "bf16_gemv,pdl"),),
    )
    report = run_bench(opts, lambda msg: None)
    assert [r.setting for r in report.ab] == ["NINFER_KERNELS_OFF=bf16_gemv,pdl", ""]
    for r in report.ab:
        assert [d.batch for d in r.decode] == [1, 2]
        assert all(d.step_ms > 0 for d in r.decode)
    assert "NINFER_KERNELS_OFF" not in os.environ
