"""`python -m ninfer.bench.kernel_bench --attention-heads / --attention-kv-dtypes /
--attention-splits / --moe-weight-copies / --moe-dirty-mb`: the head shape of the attention
sweep (the 35B-A3B's 16 over 2 beside the 27B's default 24 over 4), its KV dtypes and its split
sizes, and the MoE sweep's weight copies and dirty MiB."""

from __future__ import annotations

import argparse

import pytest

from ninfer.bench.kernel_bench import _heads, _kv_dtypes, _splits, main


@pytest.mark.parametrize(("text", "want"), [("24x4", (24, 4)), ("16X2", (16, 2)), ("8x8", (8, 8))])
def test_heads_parse(text: str, want: tuple[int, int]) -> None:
    assert _heads(text, argparse.ArgumentParser()) == want


@pytest.mark.parametrize("text", ["16x3", "16", "x2", "16x0", "a x b", "16x2x1"])
def test_bad_heads_are_usage_errors(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _heads(text, argparse.ArgumentParser())
    assert exc.value.code == 2
    assert "--attention-heads takes QxKV" in capsys.readouterr().err


def test_kv_dtypes_and_splits_parse() -> None:
    parser = argparse.ArgumentParser()
    assert _kv_dtypes("bf16", parser) == ("bf16",)
    assert _kv_dtypes(" bf16, fp8 ,int8,", parser) == ("bf16", "fp8", "int8")
    assert _splits("auto,256,512", parser) == (None, 256, 512)
    assert _splits("AUTO", parser) == (None,)
    assert _splits("32,1024", parser) == (32, 1024)


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (_kv_dtypes, "bf16,fp4", "--attention-kv-dtypes takes names of"),
        (_kv_dtypes, "", "--attention-kv-dtypes takes names of"),
        (_splits, "auto,100", "--attention-splits takes auto or powers of two >= 32"),
        (_splits, "16", "--attention-splits takes auto or powers of two >= 32"),
        (_splits, "-64", "--attention-splits takes auto or powers of two >= 32"),
        (_splits, ",", "--attention-splits needs at least one split"),
    ],
)
def test_bad_kv_dtypes_and_splits_are_usage_errors(
    parse, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(text, argparse.ArgumentParser())
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("copies", ["0", "-3"])
def test_moe_weight_copies_below_one_is_a_usage_error(
    copies: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--moe-batches", "64", "--moe-weight-copies", copies])
    assert exc.value.code == 2
    assert f"--moe-weight-copies must be at least 1, got {copies}" in capsys.readouterr().err


def test_negative_moe_dirty_mb_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--moe-batches", "64", "--moe-dirty-mb", "-1"])
    assert exc.value.code == 2
    assert "--moe-dirty-mb must be 0 or more, got -1" in capsys.readouterr().err
