"""`kernel_bench --attention-first-calls`: the table says which plan mode it measured, and a
shape whose queries outnumber its keys is refused before anything runs (the sweep itself needs
a GPU: run on the device, numbers in docs/perf.md)."""

from __future__ import annotations

import pytest
import torch

from ninfer.bench.prefill_attention_sweep import first_call_sweep
from ninfer.model.layers.cudnn_plans import AVOID_RECOMPILE


@pytest.mark.parametrize(("value", "mode"), [("1", "length-free"), ("0", "per-shape")])
def test_header_names_the_plan_mode(monkeypatch: pytest.MonkeyPatch, value: str, mode: str):
    monkeypatch.setenv(AVOID_RECOMPILE, value)
    table = first_call_sweep([], torch.device("cpu"))
    assert table.splitlines()[0] == f"cuDNN plans: {mode} ({AVOID_RECOMPILE}={value})"
    assert "| queries x keys | path | first call ms |" in table


def test_more_queries_than_keys_is_refused():
    with pytest.raises(ValueError, match="8x4: a chunk's queries are among its keys"):
        first_call_sweep([(8, 4)], torch.device("cpu"))
