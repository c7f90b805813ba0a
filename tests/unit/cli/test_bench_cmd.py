"""`ninfer bench --compare hf`: the flag and its options parse, bad values fail before any GPU
work (exit 2 through `main`), and the options reach the bench run."""

from __future__ import annotations

import sys

import pytest
import torch
from typer.testing import CliRunner

from ninfer.bench.results import BenchReport, DecodeResult, HfComparison, PrefillResult
from ninfer.cli.app import app, main
from ninfer.cli.errors import UserError

BASE = ["bench", "--synthetic", "tiny-dense"]


def _fails(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, [*BASE, *args])
    assert result.exit_code != 0
    assert isinstance(result.exception, UserError), result.output
    assert message in str(result.exception)


def test_compare_takes_only_hf() -> None:
    _fails(["--compare", "vllm"], "--compare takes 'hf'")


def test_compare_hf_refuses_fp8_weights() -> None:
    _fails(["--compare", "hf", "--weights", "fp8"], "runs bf16 only")


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--hf-batches", "1,0", "--hf-batches must be positive"),
        ("--hf-prefill", "2k", "--hf-prefill must be comma-separated integers"),
    ],
)
def test_bad_hf_lists_are_user_errors(option: str, value: str, message: str) -> None:
    _fails(["--compare", "hf", option, value], message)


def test_hf_steps_must_be_positive() -> None:
    result = CliRunner().invoke(app, [*BASE, "--compare", "hf", "--hf-steps", "0"])
    assert result.exit_code == 2  # click's own range check
    assert "--hf-steps" in result.output


def test_missing_transformers_exits_2_naming_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setattr(sys, "argv", ["ninfer", *BASE, "--compare", "hf"])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    err = " ".join(capsys.readouterr().err.split())  # rich may wrap the line
    assert "`--compare hf` needs HF transformers" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_valid_compare_options_pass_the_checks_and_reach_the_gpu_check() -> None:
    _fails(["--compare", "hf", "--hf-prefill", "256", "--hf-batches", "2"], "needs a CUDA GPU")


def test_options_reach_the_run_and_the_table_shows_ratios(monkeypatch: pytest.MonkeyPatch) -> None:
    import ninfer.bench.run as run

    seen = []

    def fake_run_bench(opts: run.BenchOptions, on_progress: object) -> BenchReport:
        seen.append(opts)
        report = BenchReport("tiny-dense", 1, "gpu", "today", "2.11", opts.command)
        report.prefill = [PrefillResult(256, 8192, 0.01, 25600.0, 10.0)]
        report.decode = [DecodeResult(2, 128, True, 1.0, 2000.0)]
        report.hf = HfComparison(
            "5.17.0",
            "sdpa",
            3,
            prefill=[PrefillResult(256, 256, 0.1, 2560.0, 100.0)],
            decode=[DecodeResult(2, 128, False, 10.0, 200.0)],
        )
        return report

    monkeypatch.setattr(run, "run_bench", fake_run_bench)
    args = ["--contexts", "128", "--compare", "hf", "--hf-prefill", "256,512"]
    result = CliRunner().invoke(app, [*BASE, *args, "--hf-batches", "2", "--hf-steps", "3"])
    assert result.exit_code == 0, result.output
    (opts,) = seen
    assert (opts.compare, opts.hf_prefill_sizes, opts.hf_decode_batches) == ("hf", (256, 512), (2,))
    assert opts.hf_decode_steps == 3 and opts.weights == "bf16" and opts.decode_tiles is False
    assert "ninfer / HF" in result.output and "10.0x" in result.output
    result = CliRunner().invoke(app, [*BASE, "--contexts", "128", "--decode-tiles"])
    assert result.exit_code == 0, result.output
    assert seen[1].decode_tiles is True


def test_unknown_kv_dtype_is_refused_before_any_gpu_work() -> None:
    _fails(["--kv-dtype", "fp4"], "--kv-dtype must be one of bf16|int8|fp8|nvfp4|k8v4")


def test_kv_dtype_reaches_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    import ninfer.bench.run as run

    seen = []

    def fake_run_bench(opts: run.BenchOptions, on_progress: object) -> BenchReport:
        seen.append(opts)
        return BenchReport("tiny-dense", 1, "gpu", "today", "2.11", opts.command, kv_dtype="k8v4")

    monkeypatch.setattr(run, "run_bench", fake_run_bench)
    result = CliRunner().invoke(app, [*BASE, "--kv-dtype", "k8v4"])
    assert result.exit_code == 0, result.output
    assert seen[0].kv_dtype == "k8v4" and "k8v4 KV" in result.output


def test_kv_dtype_quality_takes_its_contexts(monkeypatch: pytest.MonkeyPatch) -> None:
    import ninfer.bench.kv_quality_cmd as cmd

    seen = []
    monkeypatch.setattr(cmd, "run_kv_quality_cmd", lambda *args: seen.append(args))
    args = ["--kv-dtype-quality", "--kv-quality-contexts", "4096,8192", "--device", "cuda"]
    result = CliRunner().invoke(app, [*BASE, *args])
    assert result.exit_code == 0, result.output
    (args_seen,) = seen
    assert args_seen[:4] == ("tiny-dense", "cuda:0", "bf16", (4096, 8192))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ab", "PATH=/usr"], "--ab takes NAME=VALUE"),
        (["--ab", "NINFER_KERNELS_OFF"], "--ab takes NAME=VALUE"),
        (["--ab", "NINFER_KERNELS_OFF=pdl", "--vision"], "not supported with"),
        (["--ab-rounds", "3"], "--ab-rounds needs --ab"),
        (["--profile", "--vision"], "--profile covers"),
        (["--profile", "--kv-dtype-quality"], "--profile covers"),
    ],
)
def test_bad_ab_settings_and_profile_combinations_are_user_errors(
    args: list[str], message: str
) -> None:
    _fails(args, message)


def test_ab_rounds_outside_one_to_ten_is_a_usage_error() -> None:
    result = CliRunner().invoke(app, [*BASE, "--ab", "NINFER_KERNELS_OFF=pdl", "--ab-rounds", "11"])
    assert result.exit_code == 2
    assert "--ab-rounds" in result.output


def test_ab_settings_reach_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from ninfer.bench import run

    seen: list[run.BenchOptions] = []

    def fake_run_bench(opts: run.BenchOptions, on_progress: object) -> BenchReport:
        seen.append(opts)
        return BenchReport("tiny-dense", 1, "GPU", "today", "torch", "ninfer bench")

    monkeypatch.setattr(run, "run_bench", fake_run_bench)
    result = CliRunner().invoke(
        app,
        [
            *BASE,
            "--ab",
            "NINFER_KERNELS_OFF=fp8_ring,pdl;NINFER_KERNELS_ON=bf16_tc_gemv",
            "--ab-rounds",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    assert seen[0].ab_rounds == 3
    assert seen[0].ab == (
        ("NINFER_KERNELS_OFF", "fp8_ring,pdl"),
        ("NINFER_KERNELS_ON", "bf16_tc_gemv"),
    )


def test_ab_settings_reach_the_spec_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--ab` with `--spec mtp` is taken (the round's pieces per setting), not refused: the
    settings and rounds reach `_spec`, past the option checks."""
    import ninfer.cli.bench_cmd as cmd

    seen = []
    monkeypatch.setattr(cmd, "_spec", lambda **kw: seen.append(kw))
    ab = ["--ab", "NINFER_KERNELS_ON=attention_metadata", "--ab-rounds", "2"]
    result = CliRunner().invoke(app, [*BASE, "--spec", "mtp", *ab])
    assert result.exit_code == 0, result.output
    (kw,) = seen
    assert kw["ab"] == (("NINFER_KERNELS_ON", "attention_metadata"),) and kw["ab_rounds"] == 2
    assert kw["decode_tiles"] is False and kw["draft_tokens"] == 3
    result = CliRunner().invoke(app, [*BASE, "--spec", "mtp", "--decode-tiles"])
    assert result.exit_code == 0, result.output
    assert seen[1]["decode_tiles"] is True  # --decode-tiles: the synthetic model binds its tiles
