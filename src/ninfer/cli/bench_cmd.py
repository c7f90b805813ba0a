"""`ninfer bench --synthetic MODEL`: prefill, decode, kernel and ceiling timings on one GPU.

Thin: parses options, runs `ninfer.bench.run`, prints a table (or JSON). Option combinations and
`--compare hf`'s peer (transformers with Qwen3.5) are checked before any GPU work starts.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer
from rich.console import Console

from ninfer.cli.errors import UserError


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserError(f"{what} must be comma-separated integers, got {text!r}") from None
    if any(v <= 0 for v in values):
        raise UserError(f"{what} must be positive, got {text!r}")
    return values


def bench(
    synthetic: str = typer.Option(
        ..., "--synthetic", help="qwen3.6-27b or qwen3.6-35b-a3b (tiny-dense, tiny-moe: smoke)."
    ),
    device: int = typer.Option(0, "--device", help="CUDA device index.", min=0),
    weights: str = typer.Option("bf16", "--weights", help="bf16 or fp8 (e4m3, 128x128 blocks)."),
    prefill: str = typer.Option("512,2048,8192,32768", "--prefill", help="Prompt lengths."),
    prefill_chunk: int = typer.Option(8192, "--prefill-chunk", min=1, help="Tokens per forward."),
    batches: str = typer.Option("1,2,4,8", "--batches", help="Decode batch sizes."),
    contexts: str = typer.Option("1024,32768", "--contexts", help="Decode contexts."),
    steps: int = typer.Option(16, "--steps", min=1, help="Timed decode steps per cell."),
    no_kernels: bool = typer.Option(False, "--no-kernels", help="Skip the kernel timings."),
    no_ceilings: bool = typer.Option(False, "--no-ceilings", help="Skip copy/GEMM ceilings."),
    profile: bool = typer.Option(False, "--profile", help="Profile an eager decode step."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    save: Path | None = typer.Option(None, "--save", help="Also write the JSON report here."),
    compare: str | None = typer.Option(
        None,
        "--compare",
        help="hf: also run HF transformers (bf16 only) in this process over the same weight "
        "tensors, on its own small matrix (by default a 2048-token prefill and decode at batch "
        "1 and 8 at the first --contexts value: HF decodes the 27B at ~8 tok/s); ninfer's matrix "
        "is widened to hold every HF cell; reports ninfer / HF per cell and a logit check.",
    ),
    hf_prefill: str = typer.Option("2048", "--hf-prefill", help="HF prompt lengths."),
    hf_batches: str = typer.Option(
        "1,8", "--hf-batches", help="HF decode batch sizes, at the first --contexts value."
    ),
    hf_steps: int = typer.Option(8, "--hf-steps", min=1, help="Timed HF decode steps per cell."),
    e2e: bool = typer.Option(
        False, "--e2e", help="Also run the decode batches through the public Engine API."
    ),
    e2e_prompt: int = typer.Option(1000, "--e2e-prompt", min=1, help="--e2e prompt tokens."),
    e2e_output: int = typer.Option(256, "--e2e-output", min=2, help="--e2e output tokens."),
    e2e_long: int = typer.Option(
        8192, "--e2e-long-prompt", min=0, help="--e2e: prompt arriving during decode (0: skip)."
    ),
    context_cache: bool = typer.Option(
        False,
        "--context-cache",
        help="Also time a second turn's TTFT with a prefix hit against a cold run, and one "
        "sequence's snapshot to pinned host memory and restore.",
    ),
    cache_turn: int = typer.Option(
        16384, "--cache-turn-tokens", min=64, help="--context-cache: first-turn prompt tokens."
    ),
    cache_snapshot: int = typer.Option(
        32768, "--cache-snapshot-tokens", min=1, help="--context-cache: snapshot context."
    ),
) -> None:
    """Benchmark prefill and decode of a real-shape model with random weights (needs a GPU)."""
    from ninfer.bench.hf_compare import HfCompareError, require_hf
    from ninfer.bench.report import print_report, to_json
    from ninfer.bench.run import BenchError, BenchOptions, check_compare, run_bench
    from ninfer.bench.synthetic import UnknownSyntheticModel, synthetic_config

    opts = BenchOptions(
        synthetic=synthetic,
        device=f"cuda:{device}",
        prefill_sizes=_ints(prefill, "--prefill"),
        prefill_chunk=prefill_chunk,
        decode_batches=_ints(batches, "--batches"),
        decode_contexts=_ints(contexts, "--contexts"),
        decode_steps=steps,
        kernels=not no_kernels,
        ceilings=not no_ceilings,
        profile=profile,
        weights=weights,
        command=shlex.join(["ninfer", *sys.argv[1:]]),
        compare=compare,
        hf_prefill_sizes=_ints(hf_prefill, "--hf-prefill"),
        hf_decode_batches=_ints(hf_batches, "--hf-batches"),
        hf_decode_steps=hf_steps,
        e2e=e2e,
        e2e_prompt_tokens=e2e_prompt,
        e2e_output_tokens=e2e_output,
        e2e_long_prompt=e2e_long,
        context_cache=context_cache,
        cache_turn_tokens=cache_turn,
        cache_snapshot_tokens=cache_snapshot,
    )
    err = Console(stderr=True)
    try:
        check_compare(opts)
        if compare == "hf":
            require_hf(synthetic_config(synthetic).is_moe)
        with err.status("starting") as status:
            report = run_bench(opts, lambda msg: (status.update(msg), err.print(msg, style="dim")))
    except (BenchError, HfCompareError, UnknownSyntheticModel) as e:
        raise UserError(str(e)) from None
    if save is not None:
        save.write_text(to_json(report) + "\n")
    if as_json:
        print(to_json(report))
    else:
        print_report(report, Console())
