"""The `ninfer bench --kv-dtype-quality` run: random weights on the GPU, `run_kv_quality`, a table.

Imports torch, rich, model/ and bench siblings. Kept apart from the CLI module so that the command
stays a thin parser, and from kv_quality.py so that the measurement has no printing in it.
"""

from __future__ import annotations

import datetime
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from ninfer.bench.kv_quality import KvQualityResult, run_kv_quality
from ninfer.bench.report import emit_json
from ninfer.bench.synthetic import synthetic_model


def run_kv_quality_cmd(
    synthetic: str,
    device: str,
    weights: str,
    contexts: tuple[int, ...],
    steps: int,
    as_json: bool,
    save: Path | None,
) -> None:
    """Measure, then print a table (or JSON) and optionally save the JSON report."""
    if not torch.cuda.is_available():
        raise ValueError("`ninfer bench --kv-dtype-quality` needs a CUDA GPU; none is visible")
    err = Console(stderr=True)
    model = synthetic_model(synthetic, device=device, weights=weights,
                            say=lambda msg: err.print(msg, style="dim"))  # fmt: skip
    rows = run_kv_quality(
        model, contexts=contexts, timed_steps=steps,
        on_progress=lambda msg: err.print(msg, style="dim"),
    )  # fmt: skip
    report = {
        "model": synthetic,
        "weights": weights,
        "device": torch.cuda.get_device_name(torch.device(device)),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "torch_version": torch.__version__,
        "command": shlex.join(["ninfer", *sys.argv[1:]]),
        "kv_quality": [asdict(r) for r in rows],
    }
    if not emit_json(report, save, as_json):
        _print(report, rows, Console())


def _print(report: dict, rows: list[KvQualityResult], console: Console) -> None:
    console.print(
        f"[bold]{report['model']}[/] synthetic, {report['weights']} weights on "
        f"{report['device']}; torch {report['torch_version']}; {report['date']}"
    )
    table = Table(title="KV dtype vs bf16 KV (random weights; last 64 prompt rows, 16 decode rows)")
    cols = ("kv dtype", "context", "KiB/token", "prefill top-1", "prefill KL", "decode top-1",
            "decode KL", "decode tok/s", "bf16 tok/s")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="right")

    def rate(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}"

    for r in rows:
        table.add_row(
            r.kv_dtype, str(r.context), f"{r.kv_bytes_per_token / 1024:.2f}",
            f"{r.prefill_top1:.3f}", f"{r.prefill_kl:.2e}", f"{r.decode_top1:.3f}",
            f"{r.decode_kl:.2e}", rate(r.decode_tok_s), rate(r.bf16_decode_tok_s),
        )  # fmt: skip
    console.print(table)
