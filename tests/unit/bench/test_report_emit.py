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


def test_emit_json_without_save_writes_no_file(tmp_path: Path, capsys) -> None:
    assert emit_json({"a": 1}, None, True)
    assert json.loads(capsys.readouterr().out) == {"a": 1}
    assert list(tmp_path.iterdir()) == []
