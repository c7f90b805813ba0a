"""`ninfer bench --synthetic MODEL`: prefill, decode, kernel and ceiling timings on one GPU.

Thin: parses options, runs `ninfer.bench.run`, prints a table (or JSON). Option combinations and
`--compare hf`'s peer (transformers with Qwen3.5) are checked before any GPU work starts.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from rich.console import Console

from ninfer.cli.device import cuda_device
from ninfer.cli.errors import UserError
from ninfer.cli.options import opt


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise UserError(f"{what} must be comma-separated integers, got {text!r}") from None
    if any(v <= 0 for v in values):
        raise UserError(f"{what} must be positive, got {text!r}")
    return values


def bench(
    synthetic: str = opt(
        ...,
        "--synthetic",
        help="qwen3.6-27b or qwen3.6-35b-a3b (tiny-dense, tiny-moe: smoke).",
        metavar="MODEL",
    ),
    device: str = opt(
        "auto", "--device", help="CUDA device: auto, cuda, cuda:N or N.", metavar="DEVICE"
    ),
    weights: str = opt(
        "bf16", "--weights", help="bf16 or fp8 (e4m3, 128x128 blocks).", metavar="bf16|fp8"
    ),
    prefill: str = opt(
        "512,2048,8192,32768", "--prefill", help="Prompt lengths.", metavar="N,N,..."
    ),
    prefill_chunk: int = opt(
        8192, "--prefill-chunk", min=1, help="Tokens per forward.", metavar="N"
    ),
    batches: str = opt("1,2,4,8", "--batches", help="Decode batch sizes.", metavar="N,N,..."),
    contexts: str = opt("1024,32768", "--contexts", help="Decode contexts.", metavar="N,N,..."),
    steps: int = opt(16, "--steps", min=1, help="Timed decode steps per cell.", metavar="N"),
    no_kernels: bool = opt(False, "--no-kernels", help="Skip the kernel timings."),
    no_ceilings: bool = opt(False, "--no-ceilings", help="Skip copy/GEMM ceilings."),
    profile: bool = opt(False, "--profile", help="Profile an eager decode step."),
    as_json: bool = opt(False, "--json", help="Print JSON instead of tables."),
    save: Path | None = opt(
        None, "--save", help="Also write the JSON report here.", metavar="FILE"
    ),
    compare: str | None = opt(
        None,
        "--compare",
        help="hf: also run HF transformers (bf16 only) in this process over the same weight "
        "tensors, on its own small matrix (by default a 2048-token prefill and decode at batch "
        "1 and 8 at the first --contexts value: HF decodes the 27B at ~8 tok/s); ninfer's matrix "
        "is widened to hold every HF cell; reports ninfer / HF per cell and a logit check.",
        metavar="hf",
    ),
    hf_prefill: str = opt("2048", "--hf-prefill", help="HF prompt lengths.", metavar="N,N,..."),
    hf_batches: str = opt(
        "1,8",
        "--hf-batches",
        help="HF decode batch sizes, at the first --contexts value.",
        metavar="N,N,...",
    ),
    hf_steps: int = opt(
        8, "--hf-steps", min=1, help="Timed HF decode steps per cell.", metavar="N"
    ),
) -> None:
    """Benchmark prefill and decode of a real-shape model with random weights (needs a GPU)."""
    from ninfer.bench.hf_compare import HfCompareError, require_hf
    from ninfer.bench.report import print_report, to_json
    from ninfer.bench.run import BenchError, BenchOptions, check_compare, run_bench
    from ninfer.bench.synthetic import UnknownSyntheticModel, synthetic_config

    opts = BenchOptions(
        synthetic=synthetic,
        device=cuda_device(device),
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
