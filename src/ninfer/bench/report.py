"""Rendering of a BenchReport: rich tables for people, JSON for files and docs/perf.md.

Imports rich and bench.results only.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from ninfer.bench.results import BenchReport, HfComparison, StepProfile, comparison_rows


def to_json(report: BenchReport) -> str:
    return json.dumps(report.to_json(), indent=2)


def emit_json(report: BenchReport | dict, save: Path | None, as_json: bool) -> bool:
    """Write the report's JSON to `save` (if given) and print it when `as_json`; True when printed,
    so the caller skips its tables. One place for every bench mode's `--save` / `--json`."""
    if isinstance(report, BenchReport):
        text = to_json(report)
    else:  # a mode's own dict, which may hold result dataclasses (e.g. a round's StepProfile)
        text = json.dumps(report, indent=2, default=_as_dict)
    if save is not None:
        save.write_text(text + "\n")
    if as_json:
        print(text)
    return as_json


def _as_dict(value: object) -> dict:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def print_report(report: BenchReport, console: Console) -> None:
    console.print(
        f"[bold]{report.model}[/] synthetic, {report.num_params / 1e9:.1f} B params, "
        f"{report.weights} weights{' with decode tiles' if report.decode_tiles else ''}, "
        f"{report.kv_dtype} KV, bf16 activations on {report.device}; "
        f"torch {report.torch_version}; {report.date}; weights drawn in "
        f"{report.load_s:.1f} s; peak GPU memory {report.peak_memory_gib:.1f} GiB"
    )
    for when, state in (("before", report.gpu_start), ("after", report.gpu_end)):
        if state is not None:
            console.print(f"GPU {when} the matrix: {state.describe()}")
    if report.ceilings is not None:
        c = report.ceilings
        console.print(
            f"ceilings: copy {c.copy_tb_s:.2f} TB/s, bf16 GEMM {c.gemm_tflops:.0f} TFLOP/s"
        )
    if report.prefill:
        table = Table(title="prefill (one sequence)")
        for col in ("tokens", "chunk", "tok/s", "TTFT ms", "first run ms"):
            table.add_column(col, justify="right")
        for p in report.prefill:
            first = "-" if p.first_ttft_ms is None else f"{p.first_ttft_ms:,.1f}"
            table.add_row(
                str(p.num_tokens), str(p.chunk), f"{p.tok_per_s:,.0f}", f"{p.ttft_ms:,.1f}", first
            )
        console.print(table)
    if report.decode:
        table = Table(title="decode (greedy, token ids back on the host each step)")
        for col in ("batch", "context", "graphs", "step ms", "tok/s total"):
            table.add_column(col, justify="right")
        for d in report.decode:
            table.add_row(
                str(d.batch),
                str(d.context),
                "yes" if d.graphs else "no",
                f"{d.step_ms:.2f}",
                f"{d.tok_per_s:,.1f}",
            )
        console.print(table)
    if report.ab:
        _print_ab(report, console)
    if report.kernels:
        table = Table(title="kernels vs torch twins (GPU us per call, in CUDA graphs)")
        for col in ("op", "shape", "torch us", "cuda us", "speed-up", "rel err"):
            table.add_column(col, justify="right")
        for k in report.kernels:
            table.add_row(
                k.op,
                k.shape,
                f"{k.torch_us:.1f}",
                f"{k.cuda_us:.1f}",
                f"{k.torch_us / k.cuda_us:.1f}x",
                f"{k.max_rel_err:.1e}",
            )
        console.print(table)
    for profile in (report.profile, report.batch_profile, report.prefill_profile):
        if profile is not None:
            print_profile(profile, console)
    if report.e2e:
        _print_e2e(report, console)
    if report.context_cache is not None:
        _print_context_cache(report, console)
    if report.hf is not None:
        _print_hf(report, report.hf, console)
    for note in report.notes:
        console.print(f"note: {note}")


_PROFILE_TITLES = {
    "prefill": "eager prefill of {context} tokens",
    "round": "eager speculative round (the padded graph body), batch {batch} at {context}",
}


def print_profile(p: StepProfile, console: Console) -> None:
    """A profile's kernel table (and its matmuls by shape): `--profile` of every bench mode."""
    other = p.kernel_us - p.matmul_us
    title = _PROFILE_TITLES.get(p.kind, "eager decode step, batch {batch} at {context}")
    table = Table(
        title=(
            title.format(batch=p.batch, context=p.context) + f": {p.kernel_us / 1000:.2f} ms of "
            f"kernels in {p.num_kernels:.0f} launches; matmuls {p.matmul_us / 1000:.2f} ms, "
            f"the rest {other / 1000:.2f} ms"
        )
    )
    for col in ("kernel", "calls", "us / step", "share"):
        table.add_column(col, justify="right" if col != "kernel" else "left")
    for k in p.top:
        table.add_row(k.name, f"{k.calls_per_step:.0f}", f"{k.us_per_step:,.0f}", f"{k.share:.0%}")
    console.print(table)
    if p.matmuls:
        shapes = Table(title="torch matmuls by shape (cuBLAS; the CuPy GEMVs are not torch ops)")
        for col in ("op", "shape", "calls", "us / step", "TFLOP/s"):
            shapes.add_column(col, justify="right" if col not in ("op", "shape") else "left")
        for m in p.matmuls:
            shapes.add_row(
                m.op, m.shape, f"{m.calls_per_step:.0f}", f"{m.us_per_step:,.0f}", f"{m.tflops:.0f}"
            )
        console.print(shapes)


def _print_e2e(report: BenchReport, console: Console) -> None:
    table = Table(title="end to end through Engine.agenerate (greedy, EOS ignored)")
    for col in (
        "batch",
        "prompt",
        "out",
        "steady tok/s",
        "raw tok/s",
        "e2e / raw",
        "wall tok/s",
        "TTFT p50 ms",
        "TTFT max ms",
    ):
        table.add_column(col, justify="right")
    for r in report.e2e:
        table.add_row(
            str(r.batch),
            str(r.prompt_tokens),
            str(r.output_tokens),
            f"{r.steady_tok_per_s:,.1f}",
            "-" if r.raw_tok_per_s is None else f"{r.raw_tok_per_s:,.1f}",
            "-" if r.ratio is None else f"{100 * r.ratio:.1f} %",
            f"{r.wall_tok_per_s:,.1f}",
            f"{r.ttft_ms_p50:,.0f}",
            f"{r.ttft_ms_max:,.0f}",
        )
    console.print(table)
    if (i := report.interference) is not None:
        console.print(
            f"{i.long_prompt}-token prompt arriving while {i.batch} streams decode (chunk "
            f"{i.prefill_chunk}, one chunk alone {i.chunk_prefill_ms:.1f} ms): inter-token "
            f"p50 {i.itl_p50_ms_before:.1f} -> {i.itl_p50_ms_during:.1f} ms, p99 "
            f"{i.itl_p99_ms_before:.1f} -> {i.itl_p99_ms_during:.1f} ms, max during "
            f"{i.itl_max_ms_during:.1f} ms"
        )


def _print_hf(report: BenchReport, hf: HfComparison, console: Console) -> None:
    table = Table(
        title=(
            f"ninfer vs HF transformers {hf.transformers_version} ({hf.attn_implementation} "
            f"attention, eager, no CUDA graphs): same process, same weight tensors; HF decode: "
            f"median of {hf.decode_steps} steps; peak GPU memory in the HF part "
            f"{hf.peak_memory_gib:.1f} GiB"
        )
    )
    for col in ("workload", "ninfer tok/s", "HF tok/s", "ninfer / HF"):
        table.add_column(col, justify="right" if col != "workload" else "left")
    for row in comparison_rows(report):
        table.add_row(
            row.workload,
            "-" if row.ninfer_tok_per_s is None else f"{row.ninfer_tok_per_s:,.1f}",
            f"{row.hf_tok_per_s:,.1f}",
            "-" if row.ratio is None else f"{row.ratio:.1f}x",
        )
    console.print(table)
    if (c := hf.logit_check) is not None:
        console.print(
            f"logit check (a check that both run the same weights, not a benchmark): one "
            f"{c.num_tokens}-token prefill, last {c.num_positions} positions: max |ninfer - HF| "
            f"{c.max_abs_diff:.3g} against HF logits up to {c.max_abs_logit:.3g}; relative L2 "
            f"{c.rel_l2:.2e}; same greedy token at {c.argmax_agree:.0%} of the positions"
        )


def _print_context_cache(report: BenchReport, console: Console) -> None:
    c = report.context_cache
    assert c is not None
    table = Table(title="context cache (second turn: greedy, through the public Engine)")
    for col in ("turn tokens", "2nd prompt", "cached", "TTFT cold ms", "TTFT warm ms", "warm/cold"):
        table.add_column(col, justify="right")
    table.add_row(
        str(c.turn_tokens),
        str(c.second_turn_prompt),
        str(c.cached_tokens),
        f"{c.cold_ttft_ms:,.1f}",
        f"{c.warm_ttft_ms:,.1f}",
        f"{100 * c.ttft_ratio:.1f} %" + ("" if c.same_output else " (first tokens differ)"),
    )
    console.print(table)
    gib = c.snapshot_bytes / 2**30
    console.print(
        f"snapshot + restore at {c.snapshot_tokens} tokens ({gib:.2f} GiB, pinned host): "
        f"{c.snapshot_ms:.1f} + {c.restore_ms:.1f} ms "
        f"({gib / (c.snapshot_ms / 1000):.1f} / {gib / (c.restore_ms / 1000):.1f} GiB/s); "
        f"first round {c.first_snapshot_ms:.1f} + {c.first_restore_ms:.1f} ms"
    )


def _print_ab(report: BenchReport, console: Console) -> None:
    """One row per decode batch: each side's median decode step over its timings (the base: the
    matrix's and every re-timing; a setting: once per `--ab-rounds` round), its ratio to the
    base's median, and the base's spread, (max - min) / median. A ratio within that spread is
    marked "≈": this run does not tell it apart from the base (steps drift by 1-1.5 % between
    timings of one setting, docs/perf.md S35E / S35G)."""
    again = report.ab[-1]  # the base re-timed (bench/ab.py always ends with it)
    ctx, graphs = again.decode[0].context, again.decode[0].graphs
    first = {d.batch: d for d in report.decode if d.context == ctx and d.graphs == graphs}
    labels = list(dict.fromkeys(r.setting for r in report.ab if r.setting))
    table = Table(
        title=f"A/B in one process, {ctx} context (decode step ms, the median of each side's "
        "timings; ratio to the base; ≈: within the base's spread)"
    )
    for col in ("batch", "base (timings)", "base spread", *labels):
        table.add_column(col, justify="right")
    for j, d0 in enumerate(again.decode):
        base = [r.decode[j].step_ms for r in report.ab if not r.setting]
        if d0.batch in first:
            base.append(first[d0.batch].step_ms)
        mid = statistics.median(base)
        spread = (max(base) - min(base)) / mid
        cells = [str(d0.batch), f"{mid:.3f} ({len(base)})", f"{100 * spread:.1f} %"]
        for label in labels:
            ms = statistics.median(r.decode[j].step_ms for r in report.ab if r.setting == label)
            ratio = ms / mid
            cells.append(f"{ms:.3f} ({ratio:.3f}){' ≈' if abs(ratio - 1) <= spread else ''}")
        table.add_row(*cells)
    console.print(table)
