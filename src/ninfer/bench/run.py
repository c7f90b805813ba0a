"""One `ninfer bench --synthetic` session: ceilings, kernels, the model matrix, then HF's.

Imports torch, model/, kernels.runtime and bench siblings. Owns the default matrices and the order
of work (cheap, informative measurements first, so a session cut short still reports something).
`--e2e` then drives the decode batches through the public Engine. `--compare hf` runs last over
the same weight tensors, with a small matrix of its own: HF decodes
the 27B at ~8 tok/s, so ninfer's full matrix through HF would not fit one 10-minute call.
"""

from __future__ import annotations

import datetime
import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from ninfer.bench import gpu_state
from ninfer.bench.ab import run_ab
from ninfer.bench.ceilings import measure_ceilings
from ninfer.bench.context_cache import run_context_cache
from ninfer.bench.e2e import run_e2e
from ninfer.bench.hf_compare import require_hf, run_hf_compare
from ninfer.bench.model_bench import ModelBench, run_matrix
from ninfer.bench.results import BenchReport, E2eResult, InterferenceResult
from ninfer.bench.synthetic import (
    num_parameters,
    random_weights,
    synthetic_config,
    synthetic_hf_config,
)
from ninfer.kernels.kv_quant.formats import KV_DTYPES
from ninfer.kernels.runtime import KernelUnavailable
from ninfer.model.qwen3_5 import Qwen3_5Model


class BenchError(RuntimeError):
    """The benchmark cannot run here (no GPU, or a matrix that does not fit)."""


@dataclass(frozen=True)
class BenchOptions:
    synthetic: str
    device: str = "cuda:0"
    prefill_sizes: tuple[int, ...] = (512, 2048, 8192, 32768)
    prefill_chunk: int = 8192
    decode_batches: tuple[int, ...] = (1, 2, 4, 8)
    decode_contexts: tuple[int, ...] = (1024, 32768)
    decode_steps: int = 16
    kernels: bool = True
    ceilings: bool = True
    eager_baseline: bool = True
    profile: bool = False
    seed: int = 0
    weights: str = "bf16"  # or "fp8"
    decode_tiles: bool = False  # `--decode-tiles`: the model binds tile-major decode weights
    kv_dtype: str = "bf16"  # KV cache of the prefill/decode matrix (int8, fp8, nvfp4, k8v4)
    command: str = ""
    # `--compare hf`: HF transformers on its own small matrix (decode at decode_contexts[0]);
    # ninfer's matrix is widened to hold every HF cell, so each gets its ratio.
    compare: str | None = None  # None or "hf"
    hf_prefill_sizes: tuple[int, ...] = (2048,)
    hf_decode_batches: tuple[int, ...] = (1, 8)
    hf_decode_steps: int = 8
    # `--e2e`: the decode batches again through the public Engine API, beside the raw step
    e2e: bool = False
    e2e_prompt_tokens: int = 1000
    e2e_output_tokens: int = 256
    e2e_long_prompt: int = 8192
    # `--context-cache`: second-turn TTFT with a prefix hit; snapshot + restore time
    context_cache: bool = False
    cache_turn_tokens: int = 16384
    cache_snapshot_tokens: int = 32768
    # `--ab`: (NAME, VALUE) switch settings; the decode batches again under each (bench/ab.py)
    ab: tuple[tuple[str, str], ...] = ()
    ab_rounds: int = 1  # `--ab-rounds`: the cycle of settings and base, repeated


def run_bench(opts: BenchOptions, on_progress: Callable[[str], None]) -> BenchReport:
    if not torch.cuda.is_available():
        raise BenchError("`ninfer bench` needs a CUDA GPU; none is visible to torch")
    if not opts.decode_batches or not opts.decode_contexts:
        raise BenchError("give at least one decode batch and one decode context")
    device = torch.device(opts.device)
    config = synthetic_config(opts.synthetic)  # fails fast on an unknown name
    if opts.weights not in ("bf16", "fp8"):
        raise BenchError(f"--weights must be bf16 or fp8, got {opts.weights!r}")
    if opts.kv_dtype not in KV_DTYPES:
        known = "|".join(KV_DTYPES)
        raise BenchError(f"--kv-dtype must be one of {known}, got {opts.kv_dtype!r}")
    check_compare(opts)
    if opts.compare == "hf":
        require_hf(config.is_moe)  # fail now, not after the ninfer matrix
    prefill_sizes, decode_batches = widened_matrix(opts)
    report = BenchReport(
        model=opts.synthetic,
        num_params=num_parameters(opts.synthetic),
        device=torch.cuda.get_device_name(device),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        torch_version=torch.__version__,
        command=opts.command,
        weights=opts.weights,
        kv_dtype=opts.kv_dtype,
        decode_tiles=opts.decode_tiles,
    )
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    uuid = str(uuid) if uuid is not None else None
    report.gpu_start = gpu_state.query(uuid)
    if opts.ceilings:
        on_progress("ceilings: device copy and bf16 GEMM")
        report.ceilings = measure_ceilings(device)
    if opts.kernels:
        on_progress("kernels against their torch twins")
        try:
            from ninfer.bench.kernel_bench import bench_kernels

            report.kernels = bench_kernels(device)
        except KernelUnavailable as e:
            report.notes.append(f"kernels not timed: {e}")

    on_progress(f"drawing random {opts.weights} weights on {device}")
    start = time.perf_counter()
    weights = random_weights(
        opts.synthetic, device=device, seed=opts.seed, fp8=opts.weights == "fp8"
    )
    model = Qwen3_5Model(
        config,
        weights,
        dtype=torch.bfloat16,
        device=device,
        consume_weights=True,
        decode_tiles=opts.decode_tiles,
    )
    del weights  # what is left: nothing the model binds
    torch.cuda.synchronize(device)
    report.load_s = time.perf_counter() - start

    extra = opts.decode_steps + 4  # warm-up steps and the token being decoded
    small_ctx = opts.decode_contexts[0]
    bench = ModelBench(
        model,
        max_batch=max(decode_batches),
        max_seq_tokens=max(max(opts.decode_contexts) + extra, max(prefill_sizes, default=1)),
        max_total_tokens=max(decode_batches) * (small_ctx + extra),
        seed=opts.seed,
        kv_dtype=opts.kv_dtype,
    )
    report.prefill, report.decode = run_matrix(
        bench,
        prefill_sizes=prefill_sizes,
        prefill_chunk=opts.prefill_chunk,
        decode_batches=decode_batches,
        decode_contexts=opts.decode_contexts,
        decode_steps=opts.decode_steps,
        eager_baseline=opts.eager_baseline,
        on_progress=on_progress,
    )
    if bench.graphs is None:
        report.notes.append(f"decode ran eagerly: CUDA graphs unavailable ({bench.graphs_reason})")
    if opts.ab:
        report.ab = run_ab(
            bench,
            opts.ab,
            decode_batches=decode_batches,
            context=small_ctx,
            decode_steps=opts.decode_steps,
            on_progress=on_progress,
            rounds=opts.ab_rounds,
        )
    if opts.kv_dtype != "bf16" and (opts.e2e or opts.context_cache):
        report.notes.append(f"--kv-dtype {opts.kv_dtype} applies to the matrix; the --e2e and "
                            "--context-cache engines keep bf16 KV")  # fmt: skip
    if opts.profile:
        on_progress(f"profiling eager decode steps, batch 1 at {small_ctx} context")
        try:
            report.profile = bench.profile_decode(1, small_ctx)
        except Exception as e:  # NOTE: diagnostics only; the timings above still stand
            report.notes.append(f"profile failed: {type(e).__name__}: {e}")
        if max(decode_batches) > 1:
            b = max(decode_batches)
            on_progress(f"profiling eager decode steps, batch {b} at {small_ctx} context")
            try:
                report.batch_profile = bench.profile_decode(b, small_ctx)
            except Exception as e:  # NOTE: diagnostics only, as above
                report.notes.append(f"batch profile failed: {type(e).__name__}: {e}")
        if prefill_sizes:
            num_tokens = min(opts.prefill_chunk, max(prefill_sizes))
            on_progress(f"profiling an eager prefill of {num_tokens} tokens")
            try:
                report.prefill_profile = bench.profile_prefill(num_tokens)
            except Exception as e:  # NOTE: diagnostics only, as above
                report.notes.append(f"prefill profile failed: {type(e).__name__}: {e}")
    report.peak_memory_gib = torch.cuda.max_memory_allocated(device) / 2**30
    report.gpu_end = gpu_state.query(uuid)
    if opts.e2e:
        del bench  # its cache and graphs; the engines below size their own
        gc.collect()
        torch.cuda.empty_cache()
        report.e2e, report.interference = _run_e2e(model, opts, decode_batches, report, on_progress)
        bench = None
    if opts.context_cache:
        del bench  # its cache and graphs; the engines below size their own
        gc.collect()
        torch.cuda.empty_cache()
        report.context_cache = run_context_cache(
            model,
            opts.synthetic,
            turn_tokens=opts.cache_turn_tokens,
            snapshot_tokens=opts.cache_snapshot_tokens,
            prefill_chunk=min(opts.prefill_chunk, 1024),
            on_progress=on_progress,
        )
        bench = None
    if opts.compare == "hf":
        del bench  # its cache and captured graphs; the model (the shared weights) stays
        gc.collect()
        torch.cuda.empty_cache()
        report.hf = run_hf_compare(
            model,
            synthetic_hf_config(opts.synthetic),
            prefill_sizes=opts.hf_prefill_sizes,
            decode_batches=opts.hf_decode_batches,
            decode_context=small_ctx,
            decode_steps=opts.hf_decode_steps,
            seed=opts.seed,
            on_progress=on_progress,
        )
    return report


def _run_e2e(
    model: Qwen3_5Model,
    opts: BenchOptions,
    batches: Sequence[int],
    report: BenchReport,
    on_progress: Callable[[str], None],
) -> tuple[list[E2eResult], InterferenceResult | None]:
    """Each decode batch through `Engine`; its ratio is to the raw graph step of the same
    batch at the first decode context (the default 1024 matches 1000-token prompts)."""
    raw = {
        d.batch: d.tok_per_s
        for d in report.decode
        if d.graphs and d.context == opts.decode_contexts[0]
    }
    results, interference = run_e2e(
        model,
        opts.synthetic,
        batches,
        prompt_tokens=opts.e2e_prompt_tokens,
        output_tokens=opts.e2e_output_tokens,
        prefill_chunk=min(opts.prefill_chunk, 1024),
        long_prompt=opts.e2e_long_prompt,
        on_progress=on_progress,
    )
    return [replace(r, raw_tok_per_s=raw.get(r.batch)) for r in results], interference


def check_compare(opts: BenchOptions) -> None:
    """The `--compare` options alone (no GPU needed), so the CLI can refuse them up front."""
    if opts.compare is None:
        return
    if opts.compare != "hf":
        raise BenchError(f"--compare takes 'hf' (HF transformers), got {opts.compare!r}")
    if opts.weights != "bf16":
        raise BenchError("--compare hf shares the weights with HF, which runs bf16 only")
    if opts.hf_decode_steps < 1 or any(n < 1 for n in opts.hf_prefill_sizes):
        raise BenchError("--compare hf: prefill sizes and decode steps must be positive")
    if not opts.hf_decode_batches or min(opts.hf_decode_batches) < 1:
        raise BenchError("--compare hf: give at least one positive HF decode batch")


def widened_matrix(opts: BenchOptions) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """ninfer's prefill sizes and decode batches, plus every HF cell's (sorted, once each)."""
    if opts.compare != "hf":
        return opts.prefill_sizes, opts.decode_batches
    return (
        tuple(sorted({*opts.prefill_sizes, *opts.hf_prefill_sizes})),
        tuple(sorted({*opts.decode_batches, *opts.hf_decode_batches})),
    )
