"""`python -m ninfer.bench.kernel_bench --attention-heads`: the head shape of the attention
sweep (the 35B-A3B's 16 over 2 beside the 27B's default 24 over 4)."""

from __future__ import annotations

import argparse

import pytest

from ninfer.bench.kernel_bench import _heads


@pytest.mark.parametrize(("text", "want"), [("24x4", (24, 4)), ("16X2", (16, 2)), ("8x8", (8, 8))])
def test_heads_parse(text: str, want: tuple[int, int]) -> None:
    assert _heads(text, argparse.ArgumentParser()) == want


@pytest.mark.parametrize("text", ["16x3", "16", "x2", "16x0", "a x b", "16x2x1"])
def test_bad_heads_are_usage_errors(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _heads(text, argparse.ArgumentParser())
    assert exc.value.code == 2
    assert "--attention-heads takes QxKV" in capsys.readouterr().err
