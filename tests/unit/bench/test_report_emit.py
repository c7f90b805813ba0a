"""`emit_json`: every bench mode's `--save FILE` and `--json` go through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ninfer.bench.report import emit_json


@pytest.mark.parametrize("as_json", [True, False])
def test_emit_json_saves_and_prints_only_when_asked(
    as_json: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = {"model": "qwen3.6-27b", "rows": [{"batch": 1, "tok_s": 67.0}]}
    save = tmp_path / "r.json"
    assert emit_json(report, save, as_json) is as_json
    assert json.loads(save.read_text()) == report and save.read_text().endswith("}\n")
    printed = capsys.readouterr().out
    assert (json.loads(printed) == report) if as_json else printed == ""


def test_emit_json_writes_result_dataclasses_inside_a_mode_dict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--spec --profile` rows hold a StepProfile: it is written as its fields, and anything
    else that JSON cannot hold still fails loudly."""
    from ninfer.bench.results import KernelShare, StepProfile

    prof = StepProfile(1, 1024, 10.0, 6.0, 3.0, [KernelShare("k", 1.0, 4.0, 0.4)], kind="round")
    assert emit_json({"rows": [{"round_profile": prof}]}, None, True)
    row = json.loads(capsys.readouterr().out)["rows"][0]["round_profile"]
    assert row["kind"] == "round" and row["top"][0] == {
        "name": "k", "calls_per_step": 1.0, "us_per_step": 4.0, "share": 0.4
    }  # fmt: skip
    with pytest.raises(TypeError, match="set"):
        emit_json({"bad": {1, 2}}, None, True)


def test_emit_json_without_save_writes_no_file(tmp_path: Path, capsys) -> None:
    assert emit_json({"a": 1}, None, True)
    assert json.loads(capsys.readouterr().out) == {"a": 1}
    assert list(tmp_path.iterdir()) == []


def test_prefill_rows_show_the_first_run_beside_the_best() -> None:
    """A cold first run (new cuDNN plan bucket) must stay visible, not hidden by the best."""
    import io

    from rich.console import Console

    from ninfer.bench.report import print_report, to_json
    from ninfer.bench.results import BenchReport, PrefillResult

    report = BenchReport("qwen3.6-27b", 1, "gpu", "today", "2.11", "bench")
    report.prefill = [
        PrefillResult(32768, 8192, 3.4, 9637.6, 3400.0, first_ttft_ms=5183.25),
        PrefillResult(512, 8192, 0.05, 10240.0, 50.0),
    ]
    out = io.StringIO()
    print_report(report, Console(file=out, width=200))
    text = out.getvalue()
    assert "first run ms" in text and "5,183.2" in text and "3,400.0" in text
    rows = json.loads(to_json(report))["prefill"]
    assert [r["first_ttft_ms"] for r in rows] == [5183.25, None]


def test_the_header_and_json_say_whether_decode_tiles_were_bound() -> None:
    import io

    from rich.console import Console

    from ninfer.bench.report import print_report, to_json
    from ninfer.bench.results import BenchReport

    for tiles in (False, True):
        report = BenchReport("qwen3.6-27b", 1, "gpu", "today", "2.11", "bench", weights="fp8")
        report.decode_tiles = tiles
        out = io.StringIO()
        print_report(report, Console(file=out, width=200))
        assert ("fp8 weights with decode tiles" in out.getvalue()) is tiles
        assert json.loads(to_json(report))["decode_tiles"] is tiles
