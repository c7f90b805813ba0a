"""Each CUDA kernel against its torch twin at the real decode shapes, replayed in CUDA graphs.

Imports torch, kernels/ and bench.results (and fla-core, optionally, for the DeltaNet prefill
sweep). Both sides are captured (20 calls per graph) so the comparison is of GPU time, not of
Python launch cost; inputs are random (never zeros), and the kernel's result on those inputs is
checked against the twin before its time is reported. `python -m ninfer.bench.kernel_bench`
runs the DeltaNet prefill sweep (token-serial kernel, chunk kernel, fla-core) on its own.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ninfer.bench.gpu_timing import CALLS_PER_GRAPH, bf16_weight_copies
from ninfer.bench.gpu_timing import graph_us as _graph_us
from ninfer.bench.gpu_timing import rotating as _rotating
from ninfer.bench.prefill_attention_sweep import first_call_sweep, prefill_attention_sweep
from ninfer.bench.results import KernelTiming
from ninfer.bench.tc_gemv_sweep import LM_HEAD as TC_LM_HEAD
from ninfer.bench.tc_gemv_sweep import SHAPES as FP8_SHAPES
from ninfer.bench.tc_gemv_sweep import bf16_tc_sweep, fp8_gemv_sweep
from ninfer.kernels.add_rms_norm import launch as add_norm_cuda
from ninfer.kernels.add_rms_norm import reference as add_norm_ref
from ninfer.kernels.bf16_gemv import launch as bf16_gemv_cuda
from ninfer.kernels.bf16_mma_gemv import launch as bf16_mma_cuda
from ninfer.kernels.causal_conv1d import launch as conv_cuda
from ninfer.kernels.causal_conv1d import reference as conv_ref
from ninfer.kernels.expert_gemv import launch as expert_cuda
from ninfer.kernels.expert_gemv import reference as expert_ref
from ninfer.kernels.gated_delta_chunk import launch as chunk_cuda
from ninfer.kernels.gated_delta_chunk import reference as chunk_ref
from ninfer.kernels.gated_delta_decode import launch as delta_cuda
from ninfer.kernels.gated_delta_decode import reference as delta_ref
from ninfer.kernels.gated_delta_prefill import launch as prefill_cuda
from ninfer.kernels.gated_delta_prefill import reference as prefill_ref
from ninfer.kernels.gated_rms_norm import launch as gated_cuda
from ninfer.kernels.gated_rms_norm import reference as gated_ref
from ninfer.kernels.gdn_decode_front import launch as front_cuda
from ninfer.kernels.gdn_decode_front import reference as front_ref
from ninfer.kernels.int4_gemv import launch as int4_cuda
from ninfer.kernels.int4_gemv import reference as int4_ref
from ninfer.kernels.kv_quant import formats as kv_formats
from ninfer.kernels.kv_quant import reference as kv_ref
from ninfer.kernels.moe_routing import launch as routing_cuda
from ninfer.kernels.paged_decode_attention import launch as paged_cuda
from ninfer.kernels.qk_norm_rope import launch as qk_cuda
from ninfer.kernels.qk_norm_rope import reference as qk_ref
from ninfer.kernels.silu_mul import launch as silu_mul_cuda
from ninfer.kernels.silu_mul import reference as silu_mul_ref
from ninfer.kernels.switches import setting
from ninfer.model.batch import ForwardBatch
from ninfer.model.layers import moe
from ninfer.model.layers.gated_attention import build_attention_metadata, paged_attention
from ninfer.model.layers.mlp import MlpWeights, mlp


def _eager_us(fn: Callable[[], object], runs: int = 5) -> float:
    """Median GPU microseconds per eager call of `fn` (for ops that run outside graphs)."""
    fn()  # warm-up: compilation, allocator
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    times.sort()
    return times[len(times) // 2]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def bench_kernels(device: torch.device, batches: tuple[int, ...] = (1, 8)) -> list[KernelTiming]:
    """27B decode shapes: hidden 5120, 48 value heads x 128, 16 key heads x 128."""
    out = []
    bf16 = torch.bfloat16
    for b in batches:
        x = torch.randn(b, 5120, dtype=bf16, device=device)
        r = torch.randn_like(x)
        w = torch.randn(5120, dtype=bf16, device=device) * 0.1
        err = _rel(
            add_norm_cuda.add_rms_norm(x, r, w, 1e-6)[0],
            add_norm_ref.add_rms_norm(x, r, w, 1e-6)[0],
        )
        out.append(
            KernelTiming(
                "add_rms_norm",
                f"[{b}, 5120] bf16",
                _graph_us(lambda x=x, r=r, w=w: add_norm_ref.add_rms_norm(x, r, w, 1e-6)),
                _graph_us(lambda x=x, r=r, w=w: add_norm_cuda.add_rms_norm(x, r, w, 1e-6)),
                err,
            )
        )
        o = torch.randn(b * 48, 128, device=device)
        z = torch.randn(b * 48, 128, dtype=bf16, device=device)
        nw = torch.randn(128, dtype=bf16, device=device)
        err = _rel(
            gated_cuda.gated_rms_norm(o, z, nw, 1e-6, bf16),
            gated_ref.gated_rms_norm(o, z, nw, 1e-6, bf16),
        )
        out.append(
            KernelTiming(
                "gated_rms_norm",
                f"[{b * 48}, 128] fp32 -> bf16",
                _graph_us(lambda o=o, z=z, nw=nw: gated_ref.gated_rms_norm(o, z, nw, 1e-6, bf16)),
                _graph_us(lambda o=o, z=z, nw=nw: gated_cuda.gated_rms_norm(o, z, nw, 1e-6, bf16)),
                err,
            )
        )
        q = torch.nn.functional.normalize(torch.randn(b, 16, 128, device=device), dim=-1)
        k = torch.nn.functional.normalize(torch.randn(b, 16, 128, device=device), dim=-1)
        v = torch.randn(b, 48, 128, dtype=bf16, device=device)
        g = -torch.rand(b, 48, device=device)
        beta = torch.rand(b, 48, device=device)
        state = torch.randn(b + 1, 48, 128, 128, device=device) * 0.1
        slots = torch.arange(1, b + 1, device=device)
        ref_state = state.clone()
        want = delta_ref.gated_delta_rule_decode(
            q, k, v, g, beta, ref_state, slots, scale=128**-0.5
        )
        got = delta_cuda.gated_delta_rule_decode(q, k, v, g, beta, state, slots, scale=128**-0.5)
        err = max(_rel(got, want), _rel(state, ref_state))
        args = (q, k, v, g, beta, state, slots)
        out.append(
            KernelTiming(
                "gated_delta_decode",
                f"B={b}, 48 heads, 128x128 fp32 state",
                _graph_us(lambda a=args: delta_ref.gated_delta_rule_decode(*a, scale=0.088)),
                _graph_us(lambda a=args: delta_cuda.gated_delta_rule_decode(*a, scale=0.088)),
                err,
            )
        )
        out.append(_front_timing(b, device))
        out.append(_qk_timing(b, device))
        out.append(_expert_timing(b, device))
        for context in (1024, 32768) if b == 1 else (1024,):
            out.append(_paged_timing(b, context, device))
        gate_up = torch.randn(b, 2 * 17408, dtype=bf16, device=device)
        err = _rel(silu_mul_cuda.silu_mul(gate_up), silu_mul_ref.silu_mul(gate_up))
        out.append(
            KernelTiming(
                "silu_mul",
                f"[{b}, 2 x 17408] bf16",
                _graph_us(lambda gu=gate_up: silu_mul_ref.silu_mul(gu)),
                _graph_us(lambda gu=gate_up: silu_mul_cuda.silu_mul(gu)),
                err,
            )
        )
    out.extend(_prefill_timings(device))
    return out


def _prefill_timings(device: torch.device, num_tokens: int = 2048) -> list[KernelTiming]:
    """27B DeltaNet prefill of one sequence: the varlen conv + SiLU, then the fused delta rule.

    Inputs are laid out as the model passes them: qkv, a and b as column slices of the fused
    projection output, q/k/v as row-strided views of the conv output. Timed eagerly (`_eager_us`):
    prefill runs outside CUDA graphs, and the twin's batched triangular solves are not known to
    be capturable.
    """
    bf16 = torch.bfloat16
    hk, hv, dim = 16, 48, 128
    channels = 2 * hk * dim + hv * dim
    lens = (num_tokens,)
    offsets = torch.tensor([0, num_tokens], device=device)
    slots = torch.tensor([1], device=device)
    proj = torch.randn(num_tokens, channels + hv * dim + 2 * hv, dtype=bf16, device=device)
    qkv, _, b, a = proj.split((channels, hv * dim, hv, hv), dim=-1)
    conv_w = torch.randn(channels, 4, dtype=bf16, device=device) * 0.5
    conv_state = torch.randn(2, channels, 3, dtype=bf16, device=device)
    conv_args = (qkv, conv_w, conv_state, slots, lens)
    want = conv_ref.causal_conv1d(qkv, conv_w, conv_state.clone(), slots, lens)
    got = conv_cuda.causal_conv1d(*conv_args, cu_seqlens=offsets)
    conv = KernelTiming(
        "causal_conv1d",
        f"T={num_tokens}, {channels} channels, K=4 bf16",
        _eager_us(lambda: conv_ref.causal_conv1d(*conv_args, cu_seqlens=offsets)),
        _eager_us(lambda: conv_cuda.causal_conv1d(*conv_args, cu_seqlens=offsets)),
        _rel(got, want),
    )
    q, k, v = want.split((hk * dim, hk * dim, hv * dim), dim=-1)
    heads = (q.view(num_tokens, hk, dim), k.view(num_tokens, hk, dim), v.view(num_tokens, hv, dim))
    a_log = torch.rand(hv, device=device)
    dt_bias = torch.randn(hv, device=device)
    state = torch.randn(2, hv, dim, dim, device=device) * 0.1
    args = (*heads, a, b, a_log, dt_bias, state, slots, lens)
    ref_state = state.clone()
    want = prefill_ref.gated_delta_prefill(
        *heads, a, b, a_log, dt_bias, ref_state, slots, lens, scale=dim**-0.5
    )
    got = prefill_cuda.gated_delta_prefill(*args, scale=dim**-0.5, cu_seqlens=offsets)
    delta = KernelTiming(
        "gated_delta_prefill",
        f"T={num_tokens}, 48 heads, 128x128 fp32 state",
        _eager_us(lambda: prefill_ref.gated_delta_prefill(*args, scale=dim**-0.5)),
        _eager_us(
            lambda: prefill_cuda.gated_delta_prefill(*args, scale=dim**-0.5, cu_seqlens=offsets)
        ),
        max(_rel(got, want), _rel(state[1], ref_state[1])),
    )
    state.copy_(ref_state)  # one start for the chunk kernel (on a copy) and its twin (in place)
    chunk_state = state.clone()
    want = chunk_ref.gated_delta_chunk_prefill(*args, scale=dim**-0.5)
    got = chunk_cuda.gated_delta_chunk_prefill(
        *heads, a, b, a_log, dt_bias, chunk_state, slots, lens, scale=dim**-0.5,
        cu_seqlens=offsets,
    )  # fmt: skip
    chunk = KernelTiming(
        "gated_delta_chunk",
        f"T={num_tokens}, 48 heads, 128x128 fp32 state",
        _eager_us(lambda: chunk_ref.gated_delta_chunk_prefill(*args, scale=dim**-0.5)),
        _eager_us(
            lambda: chunk_cuda.gated_delta_chunk_prefill(*args, scale=dim**-0.5, cu_seqlens=offsets)
        ),
        max(_rel(got, want), _rel(chunk_state[1], state[1])),
    )
    return [conv, delta, chunk]


@dataclass(frozen=True)
class DeltaPrefillRow:
    """One length of the DeltaNet prefill sweep: eager ms per call and output differences."""

    tokens: int
    serial_ms: float  # the token-serial kernel (gated_delta_prefill)
    chunk_ms: float  # the chunked tensor-core kernel (gated_delta_chunk)
    fla_ms: float | None  # fla-core's chunk_gated_delta_rule, where importable and timed
    chunk_vs_serial: float  # ||chunk - serial|| / ||serial||, outputs and final states (max)
    chunk_vs_fla: float | None  # same against fla's bf16 output and fp32 final state


def _fla_chunk_rule() -> Callable[..., tuple[torch.Tensor, torch.Tensor]] | None:
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError:
        return None
    return chunk_gated_delta_rule


def delta_prefill_sweep(
    lengths: Sequence[int],
    device: torch.device,
    *,
    runs: int = 10,
    fla_min_tokens: int = 2048,
) -> list[DeltaPrefillRow]:
    """The 27B DeltaNet layer (B = 1, 48 value heads, 16 key heads, 128 x 128, bf16 in, fp32
    state) at each length: eager ms per call (CUDA events, median of `runs` after a warm-up call).

    Every side starts from the raw conv output and gate projections and does its own q/k L2 norm,
    g and beta (fla with `use_qk_l2norm_in_kernel`, `use_gate_in_kernel` and
    `use_beta_sigmoid_in_kernel`); ninfer reads q/k/v as row-strided views as the model passes
    them, fla gets dense [1, T, H, D] copies (made outside the timing). fla runs from
    `fla_min_tokens` tokens up (each new length costs it Triton compilation and autotuning).
    """
    fla_rule = _fla_chunk_rule()
    rows = []
    for num_tokens in lengths:
        use_fla = fla_rule if num_tokens >= fla_min_tokens else None
        rows.append(_sweep_one(num_tokens, device, runs, use_fla))
        torch.cuda.empty_cache()
    return rows


def _sweep_one(
    num_tokens: int,
    device: torch.device,
    runs: int,
    fla_rule: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None,
) -> DeltaPrefillRow:
    hk, hv, dim = 16, 48, 128
    scale = dim**-0.5
    conv = torch.randn(num_tokens, 2 * hk * dim + hv * dim, device=device).to(torch.bfloat16)
    proj = torch.randn(num_tokens, 2 * hv, device=device).to(torch.bfloat16)
    q, k, v = conv.split((hk * dim, hk * dim, hv * dim), dim=-1)
    q, k = q.view(num_tokens, hk, dim), k.view(num_tokens, hk, dim)
    v = v.view(num_tokens, hv, dim)
    b, a = proj[:, :hv], proj[:, hv:]
    a_log = torch.rand(hv, device=device) * 2 - 1
    dt_bias = torch.randn(hv, device=device)
    state0 = torch.randn(2, hv, dim, dim, device=device) * 0.1
    slots = torch.tensor([1], device=device)
    offsets = torch.tensor([0, num_tokens], device=device)
    inputs = (q, k, v, a, b, a_log, dt_bias)

    def run(launcher: Callable[..., torch.Tensor], state: torch.Tensor) -> torch.Tensor:
        return launcher(*inputs, state, slots, (num_tokens,), scale=scale, cu_seqlens=offsets)

    serial_state, chunk_state, scratch = state0.clone(), state0.clone(), state0.clone()
    serial_out = run(prefill_cuda.gated_delta_prefill, serial_state)
    chunk_out = run(chunk_cuda.gated_delta_chunk_prefill, chunk_state)
    chunk_vs_serial = max(_rel(chunk_out, serial_out), _rel(chunk_state[1], serial_state[1]))
    serial_us = _eager_us(lambda: run(prefill_cuda.gated_delta_prefill, scratch), runs)
    chunk_us = _eager_us(lambda: run(chunk_cuda.gated_delta_chunk_prefill, scratch), runs)
    fla_ms = chunk_vs_fla = None
    if fla_rule is not None:
        dense = [t.contiguous()[None] for t in (q, k, v, a, b)]
        kwargs = {
            "scale": scale,
            "output_final_state": True,
            "use_qk_l2norm_in_kernel": True,
            "use_gate_in_kernel": True,
            "A_log": a_log,
            "dt_bias": dt_bias,
            "use_beta_sigmoid_in_kernel": True,
        }
        with torch.no_grad():
            fla_out, fla_state = fla_rule(*dense, initial_state=state0[1:2].clone(), **kwargs)
            chunk_vs_fla = max(_rel(chunk_out, fla_out[0]), _rel(chunk_state[1], fla_state[0]))
            h0 = state0[1:2].clone()
            fla_ms = _eager_us(lambda: fla_rule(*dense, initial_state=h0, **kwargs), runs) / 1e3
    return DeltaPrefillRow(
        num_tokens, serial_us / 1e3, chunk_us / 1e3, fla_ms, chunk_vs_serial, chunk_vs_fla
    )


def _format_sweep(rows: Sequence[DeltaPrefillRow]) -> str:
    def num(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    lines = [
        "DeltaNet prefill, 27B layer (B=1, 48 v / 16 k heads, 128x128, bf16 in, fp32 state)",
        f"{'tokens':>7} {'serial ms':>10} {'chunk ms':>9} {'fla ms':>8} {'chunk/fla':>9} "
        f"{'vs serial':>10} {'vs fla':>9}",
    ]
    for r in rows:
        ratio = None if r.fla_ms is None else r.chunk_ms / r.fla_ms
        lines.append(
            f"{r.tokens:>7} {r.serial_ms:>10.3f} {r.chunk_ms:>9.3f} {num(r.fla_ms, '.3f'):>8} "
            f"{num(ratio, '.2f'):>9} {r.chunk_vs_serial:>10.2e} {num(r.chunk_vs_fla, '.2e'):>9}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m ninfer.bench.kernel_bench [--tokens 2048,8192,32768] [--json PATH]`."""
    parser = argparse.ArgumentParser(
        prog="python -m ninfer.bench.kernel_bench",
        description="DeltaNet prefill: token-serial kernel, chunk kernel and fla-core (GPU).",
    )
    parser.add_argument("--tokens", default="2048,8192,32768", help="Sequence lengths.")
    parser.add_argument("--runs", type=int, default=10, help="Timed calls per cell (median).")
    parser.add_argument("--fla-min-tokens", type=int, default=2048)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="Also write the rows here.")
    parser.add_argument(
        "--decode-batches",
        default="",
        help="Instead: the delta-rule decode step's two kernels at these batch sizes.",
    )
    parser.add_argument(
        "--moe-batches",
        default="",
        help="Instead: one 35B-A3B MoE layer's expert paths at these decode batch sizes (the "
        "grouped GEMV on tensor cores and on CUDA cores), its two grouped GEMVs alone per kernel, "
        "then its routed + shared expert work with the shared expert separate or in the gathered "
        "kernels.",
    )
    parser.add_argument(
        "--moe-weight-copies",
        type=int,
        default=1,
        help="--moe-batches: the grouped GEMVs alone cycle through this many copies of the "
        "layer's expert weights (1: one layer's, as before; more: each call's weights as cold as "
        "a decode step's, whose 40 layers stream 40 different GB).",
    )
    parser.add_argument(
        "--moe-dirty-mb",
        type=int,
        default=0,
        help="--moe-batches: before each grouped GEMV call, rewrite this many MiB of fp32 (as "
        "the delta rule rewrites its states before a layer's MoE) and report the GEMV's time "
        "as the pair's less the rewrite's alone: what dirty L2 lines cost the GEMV.",
    )
    parser.add_argument(
        "--attention-contexts",
        default="",
        help="Instead: the paged decode attention per KV dtype and split size at these contexts.",
    )
    parser.add_argument(
        "--attention-batches",
        default="1,8",
        help="With --attention-contexts: the rows (sequences) per call.",
    )
    parser.add_argument(
        "--attention-heads",
        default="24x4",
        help="With --attention-contexts: QxKV heads of 256 (24x4 the 27B, 16x2 the 35B-A3B).",
    )
    parser.add_argument(
        "--attention-kv-dtypes",
        default="bf16,fp8,int8",
        help="With --attention-contexts: the KV dtypes (of --kv-dtype) to time.",
    )
    parser.add_argument(
        "--attention-splits",
        default="auto,64,128,256,512",
        help="With --attention-contexts: tokens per split (powers of two >= 32; auto: the "
        "launcher's plan).",
    )
    parser.add_argument(
        "--int4-rows",
        default="",
        help="Instead: the int4 kernels (CUDA cores up to 8 rows, tensor cores up to 64) vs bf16 "
        "F.linear on the 27B shortlist at these row counts.",
    )
    parser.add_argument(
        "--gemv-shapes",
        nargs="?",
        const=",".join(f"{n}x{k}" for n, k in GEMV_SHAPES),
        default="",
        help="Instead: the bf16 GEMV (1..8 rows) and the tensor-core skinny GEMM (1..64 rows, "
        "each compiled variant) vs F.linear at these NxK weight shapes (no value: the 35B and "
        "27B decode projections).",
    )
    parser.add_argument(
        "--gemv-rows",
        default="1,4,8",
        help="x row counts of --gemv-shapes (1..64; the bf16 GEMV runs up to 8).",
    )
    parser.add_argument(
        "--fp8-shapes",
        nargs="?",
        const=",".join(f"{n}x{k}" for n, k in FP8_SHAPES),
        default="",
        help="Instead: the tensor-core fp8 GEMV's register and ring forms at these NxK shapes "
        "(no value: the 27B decode projections), x rows from --gemv-rows (1..8).",
    )
    parser.add_argument(
        "--bf16-tc-shapes",
        nargs="?",
        const=",".join(f"{n}x{k}" for n, k in (*FP8_SHAPES, TC_LM_HEAD)),
        default="",
        help="Instead: the tensor-core bf16 GEMV (each ring depth and split count) vs the "
        "CUDA-core GEMV and F.linear at these NxK shapes (no value: the 27B decode projections "
        "and lm_head), x rows from --gemv-rows (1..8).",
    )
    parser.add_argument(
        "--prefill-attention",
        default="",
        help="Instead: a continued prefill chunk's attention on the 27B heads at these QxL "
        "shapes (queries x keys): one lower-right flash call vs the cuDNN split.",
    )
    parser.add_argument(
        "--attention-first-calls",
        default="",
        help="Instead: the first and the warm call of prefill attention at these QxL shapes, in "
        "order (Q == L: fresh causal; L > Q: the split form), as a new prompt or prefix length "
        "meets it. Run in a fresh process.",
    )
    opts = parser.parse_args(argv)
    if opts.moe_weight_copies < 1:
        parser.error(f"--moe-weight-copies must be at least 1, got {opts.moe_weight_copies}")
    if opts.moe_dirty_mb < 0:
        parser.error(f"--moe-dirty-mb must be 0 or more, got {opts.moe_dirty_mb}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    if opts.attention_first_calls:
        shapes = [_parse_shape(s) for s in opts.attention_first_calls.split(",") if s.strip()]
        print(first_call_sweep(shapes, torch.device("cuda", opts.device)))
        return
    if opts.prefill_attention:
        shapes = [_parse_shape(s) for s in opts.prefill_attention.split(",") if s.strip()]
        print(prefill_attention_sweep(shapes, torch.device("cuda", opts.device)))
        return
    if opts.fp8_shapes:
        shapes = [_parse_shape(s) for s in opts.fp8_shapes.split(",") if s.strip()]
        rows = [int(x) for x in opts.gemv_rows.split(",") if x.strip()]
        print(fp8_gemv_sweep(shapes, rows, torch.device("cuda", opts.device)))
        return
    if opts.bf16_tc_shapes:
        shapes = [_parse_shape(s) for s in opts.bf16_tc_shapes.split(",") if s.strip()]
        rows = [int(x) for x in opts.gemv_rows.split(",") if x.strip()]
        print(bf16_tc_sweep(shapes, rows, torch.device("cuda", opts.device)))
        return
    if opts.gemv_shapes:
        shapes = [_parse_shape(s) for s in opts.gemv_shapes.split(",") if s.strip()]
        rows = [int(x) for x in opts.gemv_rows.split(",") if x.strip()]
        print(bf16_gemv_sweep(shapes, rows, torch.device("cuda", opts.device)))
        return
    if opts.attention_contexts:
        contexts = [int(x) for x in opts.attention_contexts.split(",") if x.strip()]
        batches = [int(x) for x in opts.attention_batches.split(",") if x.strip()]
        q_heads, kv_heads = _heads(opts.attention_heads, parser)
        kv_dtypes = _kv_dtypes(opts.attention_kv_dtypes, parser)
        splits = _splits(opts.attention_splits, parser)
        print(attention_sweep(contexts, torch.device("cuda", opts.device), batches, kv_dtypes,
                              splits, heads=(q_heads, kv_heads)))  # fmt: skip
        return
    if opts.int4_rows:
        rows = [int(x) for x in opts.int4_rows.split(",") if x.strip()]
        print(int4_sweep(rows, torch.device("cuda", opts.device)))
        return
    if opts.moe_batches:
        batches = [int(x) for x in opts.moe_batches.split(",") if x.strip()]
        print(moe_path_sweep(batches, torch.device("cuda", opts.device)))
        print()
        print(
            moe_group_gemv_sweep(
                batches,
                torch.device("cuda", opts.device),
                copies=opts.moe_weight_copies,
                dirty_mb=opts.moe_dirty_mb,
            )
        )
        print()
        print(moe_shared_sweep(batches, torch.device("cuda", opts.device)))
        print()
        print(expert_sort_sweep(batches, torch.device("cuda", opts.device)))
        return
    if opts.decode_batches:
        batches = [int(x) for x in opts.decode_batches.split(",") if x.strip()]
        print(delta_decode_sweep(batches, torch.device("cuda", opts.device)))
        return
    lengths = [int(x) for x in opts.tokens.split(",") if x.strip()]
    rows = delta_prefill_sweep(
        lengths,
        torch.device("cuda", opts.device),
        runs=opts.runs,
        fla_min_tokens=opts.fla_min_tokens,
    )
    print(_format_sweep(rows))
    if opts.json is not None:
        opts.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))


def _front_timing(b: int, device: torch.device) -> KernelTiming:
    """The DeltaNet decode front at 27B shapes: 16 key heads, 48 value heads, 128 dims."""
    bf16 = torch.bfloat16
    channels = 2 * 16 * 128 + 48 * 128
    qkv = torch.randn(b, channels, dtype=bf16, device=device)
    a = torch.randn(b, 48, dtype=bf16, device=device)
    bb = torch.randn(b, 48, dtype=bf16, device=device)
    conv_w = torch.randn(channels, 4, dtype=bf16, device=device) * 0.5
    a_log = torch.randn(48, device=device)
    dt_bias = torch.randn(48, device=device)
    state = torch.randn(b + 1, channels, 3, dtype=bf16, device=device)
    slots = torch.arange(1, b + 1, device=device)
    kw = {"num_k_heads": 16, "head_k_dim": 128}
    weights = (qkv, a, bb, conv_w, a_log, dt_bias)
    want = front_ref.gdn_decode_front(*weights, state.clone(), slots, **kw)
    got = front_cuda.gdn_decode_front(*weights, state, slots, **kw)
    err = max(_rel(x, y) for x, y in zip(got, want, strict=True))
    args = (qkv, a, bb, conv_w, a_log, dt_bias, state, slots)
    return KernelTiming(
        "gdn_decode_front",
        f"B={b}, 10240 conv channels, 48 heads",
        _graph_us(lambda a=args: front_ref.gdn_decode_front(*a, **kw)),
        _graph_us(lambda a=args: front_cuda.gdn_decode_front(*a, **kw)),
        err,
    )


def _qk_timing(b: int, device: torch.device) -> KernelTiming:
    """q/k norm + RoPE at 27B shapes: 24 q heads (strided in the gated projection), 4 k heads."""
    bf16 = torch.bfloat16
    proj = torch.randn(b, 24 * 512 + 4 * 256, dtype=bf16, device=device)
    q = proj[:, : 24 * 512].view(b, 24, 2, 256)[:, :, 0]
    k = proj[:, 24 * 512 :].view(b, 4, 256)
    qw = torch.randn(256, dtype=bf16, device=device) * 0.1
    kw = torch.randn(256, dtype=bf16, device=device) * 0.1
    angles = torch.rand(b, 32, device=device) * 1000
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    args = (q, k, qw, kw, cos, sin, 1e-6)
    err = max(
        _rel(x, y)
        for x, y in zip(qk_cuda.qk_norm_rope(*args), qk_ref.qk_norm_rope(*args), strict=True)
    )
    return KernelTiming(
        "qk_norm_rope",
        f"[{b}, 24 + 4, 256] bf16, rotary 64",
        _graph_us(lambda: qk_ref.qk_norm_rope(*args)),
        _graph_us(lambda: qk_cuda.qk_norm_rope(*args)),
        err,
    )


def _expert_timing(b: int, device: torch.device) -> KernelTiming:
    """MoE gate-up at 35B-A3B shapes: 256 experts [1024, 2048], top-8 per token."""
    bf16 = torch.bfloat16
    weight = torch.randn(256, 1024, 2048, dtype=bf16, device=device) * 0.02
    x = torch.randn(b, 2048, dtype=bf16, device=device)
    ids = torch.randint(0, 256, (8 * b,), device=device)
    got = expert_cuda.expert_gemv(x, weight, ids, rows_per_input=8)
    err = _rel(got, expert_ref.expert_gemv(x, weight, ids, rows_per_input=8))
    return KernelTiming(
        "expert_gemv",
        f"{b} x top-8 of 256 experts [1024, 2048] bf16",
        _graph_us(lambda: expert_ref.expert_gemv(x, weight, ids, rows_per_input=8)),
        _graph_us(lambda: expert_cuda.expert_gemv(x, weight, ids, rows_per_input=8)),
        err,
    )


def _paged_timing(b: int, context: int, device: torch.device) -> KernelTiming:
    """27B decode attention (24 q heads over 4 KV heads of 256) against the model's torch path."""
    bf16 = torch.bfloat16
    page_size = 64
    num_pages = -(-(context + 1) // page_size)
    k_pages = torch.randn(b * num_pages, page_size, 4, 256, dtype=bf16, device=device)
    v_pages = torch.randn_like(k_pages)
    tables = [list(range(i * num_pages, (i + 1) * num_pages)) for i in range(b)]
    batch = ForwardBatch.decode(
        [0] * b,
        num_computed=[context] * b,
        page_tables=tables,
        state_slots=list(range(b)),
        device=device,
    )
    meta = build_attention_metadata(batch, page_size)
    q = torch.randn(b, 24, 256, dtype=bf16, device=device)
    scale = 256**-0.5

    def kernel() -> torch.Tensor:
        return paged_cuda.paged_decode_attention(
            q, k_pages, v_pages, meta.page_table, meta.kv_lens, scale=scale
        )

    err = _rel(kernel(), paged_attention(q, k_pages, v_pages, meta, scale=scale))
    return KernelTiming(
        "paged_decode_attention",
        f"B={b}, {context} ctx, 24/4 heads x 256 bf16",
        _graph_us(lambda: paged_attention(q, k_pages, v_pages, meta, scale=scale)),
        _graph_us(kernel),
        err,
    )


def delta_decode_sweep(batches: Sequence[int], device: torch.device) -> str:
    """µs per call and state GB/s of the narrow and wide delta-rule decode kernels (graphs).

    27B (48 value heads) and 35B-A3B (32) layer shapes; bytes = fp32 state read and written.
    """
    lines = ["| value heads | batch | narrow µs | wide µs | narrow TB/s | wide TB/s | auto |"]
    lines.append("| ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for heads in (48, 32):
        for b in batches:
            q = torch.nn.functional.normalize(torch.randn(b, 16, 128, device=device), dim=-1)
            k = torch.nn.functional.normalize(torch.randn(b, 16, 128, device=device), dim=-1)
            v = torch.randn(b, heads, 128, dtype=torch.bfloat16, device=device)
            g = -torch.rand(b, heads, device=device)
            beta = torch.rand(b, heads, device=device)
            state = torch.randn(b + 1, heads, 128, 128, device=device) * 0.1
            slots = torch.arange(1, b + 1, device=device)
            args = (q.bfloat16(), k.bfloat16(), v, g, beta, state, slots)
            us = {
                variant: _graph_us(
                    lambda a=args, var=variant: delta_cuda.gated_delta_rule_decode(
                        *a, scale=0.088, variant=var
                    )
                )
                for variant in ("narrow", "wide")
            }
            moved = 2 * b * heads * 128 * 128 * 4
            auto = "wide" if delta_cuda.use_wide_kernel("auto", b, heads, 128, state) else "narrow"
            lines.append(
                f"| {heads} | {b} | {us['narrow']:.1f} | {us['wide']:.1f} | "
                f"{moved / us['narrow'] / 1e6:.2f} | {moved / us['wide'] / 1e6:.2f} | {auto} |"
            )
    return "\n".join(lines)


@contextlib.contextmanager
def _switched_off(name: str | None) -> Iterator[None]:
    """NINFER_KERNELS_OFF with `name` added for the duration (dispatch reads it per call, so a
    graph captured inside keeps the variant); nothing when `name` is None."""
    if name is None:
        yield
        return
    old = os.environ.get("NINFER_KERNELS_OFF")
    with setting("NINFER_KERNELS_OFF", f"{old},{name}" if old else name):
        yield


def moe_path_sweep(batches: Sequence[int], device: torch.device) -> str:
    """µs per call of one 35B-A3B MoE layer's routed experts by each sync-free path (graphs).

    Hidden 2048, 256 experts of 2 x 512 rows, top-8; the touched experts' bytes over the time
    give each path's effective weight bandwidth. The grouped GEMV twice: on tensor cores (what
    dispatch runs for bf16) and on CUDA cores (`expert_group_mma` switched off, "fma").
    """
    experts, hidden, inter, top_k = 256, 2048, 512, 8
    gate_up = torch.randn(experts, 2 * inter, hidden, device=device, dtype=torch.bfloat16) * 0.02
    down = torch.randn(experts, hidden, inter, device=device, dtype=torch.bfloat16) * 0.04
    grouped = moe.ExpertPath.GROUPED_GEMV
    variants = (  # (column, path, NINFER_KERNELS_OFF entry)
        (moe.ExpertPath.GATHERED.value, moe.ExpertPath.GATHERED, None),
        (f"{grouped.value} mma", grouped, None),
        (f"{grouped.value} fma", grouped, "expert_group_mma"),
        (moe.ExpertPath.GROUPED_MM.value, moe.ExpertPath.GROUPED_MM, None),
    )
    lines = [
        "| batch | experts touched | "
        + " | ".join(f"{name} µs" for name, _, _ in variants)
        + " | best TB/s |"
    ]
    lines.append("| ---: | ---: |" + " ---: |" * (len(variants) + 1))
    for b in batches:
        x = torch.randn(b, hidden, device=device, dtype=torch.bfloat16)
        logits = torch.randn(b, experts, device=device)
        weights, ids = torch.topk(logits.softmax(-1), top_k)
        touched = int(torch.unique(ids).numel())
        us = []
        for _, path, off in variants:
            with _switched_off(off):
                us.append(
                    _graph_us(
                        lambda p=path, a=(x, weights, ids): moe.moe_experts(
                            a[0], gate_up, down, a[1], a[2], path=p
                        ),
                        replays=5,
                    )
                )
        moved = touched * 3 * inter * hidden * 2
        lines.append(
            f"| {b} | {touched} | "
            + " | ".join(f"{u:.1f}" for u in us)
            + f" | {moved / min(us) / 1e6:.2f} |"
        )
    return "\n".join(lines)


def _after_rewrite(buffer: torch.Tensor, fn: Callable[[], object]) -> object:
    """fn() after rewriting `buffer` in place (read and written: its lines left dirty in L2)."""
    buffer.add_(1.0)
    return fn()


def moe_group_gemv_sweep(
    batches: Sequence[int], device: torch.device, copies: int = 1, dirty_mb: int = 0
) -> str:
    """µs per call (graphs) and touched-expert TB/s of the two grouped expert GEMVs of one
    35B-A3B MoE layer (gate-up: [256, 1024, 2048], 8 rows per input; down: [256, 2048, 512] of
    SwiGLU'd gate-up rows), CUDA-core kernel ("fma") against the tensor-core one as dispatch runs
    it ("mma cp": the weight ring in shared memory) and its register ring per load depth ("mma
    dD"), and the tensor-core results' error against the twin (both GEMVs, relative).

    `copies` > 1: each call reads the next of that many copies of the weights. One layer's 1.5 GB
    is far past the L2 either way; the copies ask whether weights a step has not touched for a
    while (its other 39 layers') stream slower than one layer's read again and again (run S41A:
    the gate-up 355 µs a layer inside an H100 step against 308 here).

    `dirty_mb` > 0: each call follows an in-place rewrite of that many MiB of fp32 (read and
    written, as the 35B-A3B's delta rule rewrites 134 MB of states at 64 rows just before a
    layer's MoE), and a cell is the pair's time less the rewrite's alone: whether the dirty lines
    the rewrite leaves in L2, written back while the GEMV streams, are the in-step difference."""
    if copies < 1:
        raise ValueError(f"copies must be at least 1, got {copies}")
    if dirty_mb < 0:
        raise ValueError(f"dirty_mb must be 0 or more, got {dirty_mb}")
    dirty = torch.zeros(dirty_mb * 2**18, device=device)  # MiB of fp32
    rewrite = functools.partial(_after_rewrite, dirty, lambda: None)  # the rewrite alone
    rewrite_us = _graph_us(rewrite, replays=5) if dirty_mb else 0.0
    experts, hidden, inter, top_k = 256, 2048, 512, 8
    bf16 = torch.bfloat16
    gate_up = torch.randn(experts, 2 * inter, hidden, device=device, dtype=bf16) * 0.02
    down = torch.randn(experts, hidden, inter, device=device, dtype=bf16) * 0.04
    gate_ups = [gate_up] + [torch.randn_like(gate_up) * 0.02 for _ in range(copies - 1)]
    downs = [down] + [torch.randn_like(down) * 0.04 for _ in range(copies - 1)]
    routed = "mma cp" if expert_cuda.uses_cp_ring() else "mma routed"
    variants = [("fma", {"tensor_cores": False}), (routed, {})] + [
        (f"mma d{d}", {"depth": d}) for d in expert_cuda.GROUP_MMA_DEPTHS
    ]
    cells = [f"{which} {name}" for which in ("gate-up", "down") for name, _ in variants]
    lines = ["| batch | experts touched | " + " | ".join(f"{c} µs (TB/s)" for c in cells)]
    lines[0] += " | mma vs twin |"
    lines.append("| ---: | ---: |" + " ---: |" * (len(cells) + 1))
    for b in batches:
        x = torch.randn(b, hidden, device=device, dtype=bf16)
        logits = torch.randn(b, experts, device=device)
        flat = torch.topk(logits, top_k).indices.reshape(-1)
        groups = expert_ref.expert_groups(flat, experts)
        touched = int(torch.unique(flat).numel())
        rows = torch.randn(b * top_k, 2 * inter, device=device, dtype=bf16)  # gate-up outputs
        calls = {
            "gate-up": (x, gate_ups, {"rows_per_input": top_k}),
            "down": (rows, downs, {"rows_per_input": 1, "swiglu_input": True}),
        }
        row = []
        errors = []
        for inp, weights, kw in calls.values():
            weight = weights[0]
            moved = touched * weight.shape[1] * weight.shape[2] * 2
            for _, extra in variants:
                one = functools.partial(
                    expert_cuda.expert_group_gemv,
                    inp,
                    expert_ids=flat,
                    groups=groups,
                    **kw,
                    **extra,
                )
                call = _rotating(lambda w, f=one: f(weight=w), weights)
                if dirty_mb:
                    call = functools.partial(_after_rewrite, dirty, call)
                us = _graph_us(call, replays=5) - rewrite_us
                row.append(f"{us:.1f} ({moved / us / 1e6:.2f})")
            got = expert_cuda.expert_group_gemv(inp, weight, flat, groups=groups, **kw)
            errors.append(_rel(got, expert_ref.expert_group_gemv(inp, weight, flat, **kw)))
        lines.append(f"| {b} | {touched} | " + " | ".join(row) + f" | {max(errors):.1e} |")
    return "\n".join(lines)


def expert_sort_sweep(batches: Sequence[int], device: torch.device) -> str:
    """µs per call (graphs) of the grouped MoE path's sort by expert (35B-A3B: 256 experts,
    top-8): torch's stable sort + searchsorted against the one-launch `expert_sort`, and
    whether the two agree bit for bit."""
    experts, top_k = 256, 8
    lines = ["| batch | assignments | torch sort µs | expert_sort µs | equal |"]
    lines.append("| ---: | ---: | ---: | ---: | --- |")
    for b in batches:
        flat = torch.topk(torch.randn(b, experts, device=device), top_k).indices.reshape(-1)
        torch_us = _graph_us(functools.partial(expert_ref.expert_groups, flat, experts))
        if not routing_cuda.supports_sort(flat, experts):
            lines.append(f"| {b} | {flat.numel()} | {torch_us:.1f} | – | – |")
            continue
        kernel_us = _graph_us(functools.partial(routing_cuda.expert_sort, flat, experts))
        got, want = routing_cuda.expert_sort(flat, experts), expert_ref.expert_groups(flat, experts)
        same = all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
        lines.append(f"| {b} | {flat.numel()} | {torch_us:.1f} | {kernel_us:.1f} | {same} |")
    return "\n".join(lines)


def moe_shared_sweep(batches: Sequence[int], device: torch.device) -> str:
    """µs per call of one 35B-A3B MoE layer's routed + shared expert work on the gathered path,
    the shared expert separate or inside the expert kernels, per expert_gemv unroll (graphs).

    Separate (today's form): the shared `mlp` (cuBLAS gate-up GEMV, silu_mul, cuBLAS down GEMV),
    then expert_gemv and expert_down_sum with its output. Fused: the shared expert as one more
    assignment per token of both kernels. Routing is left out (the same for both). Also the
    routed gate-up GEMV alone per unroll, with its bandwidth over the bytes it reads (4 MiB of
    gate-up per assignment, experts chosen twice counted twice). Shared expert Is = I = 512.
    """
    experts, hidden, inter, top_k = 256, 2048, 512, 8
    bf16 = torch.bfloat16
    gate_up = torch.randn(experts, 2 * inter, hidden, device=device, dtype=bf16) * 0.02
    down = torch.randn(experts, hidden, inter, device=device, dtype=bf16) * 0.04
    shared_gate_up = torch.randn(2 * inter, hidden, device=device, dtype=bf16) * 0.02
    shared_down = torch.randn(hidden, inter, device=device, dtype=bf16) * 0.04
    shared_mlp = MlpWeights(
        shared_gate_up[:inter], shared_gate_up[inter:], shared_down, shared_gate_up
    )
    unrolls = expert_cuda.GEMV_UNROLLS
    lines = [
        "| batch | "
        + " | ".join(f"separate u{u} µs" for u in unrolls)
        + " | "
        + " | ".join(f"fused u{u} µs" for u in unrolls)
        + " | "
        + " | ".join(f"gate-up GEMV u{u} µs (TB/s)" for u in unrolls)
        + " | fused vs separate | fused vs twin |"
    ]
    lines.append("| ---: |" + " ---: |" * (3 * len(unrolls) + 2))
    for b in batches:
        x = torch.randn(b, hidden, device=device, dtype=bf16)
        logits = torch.randn(b, experts, device=device)
        weights, ids = torch.topk(logits.softmax(-1), top_k)
        flat = ids.reshape(-1)
        gate = torch.randn(b, 1, device=device, dtype=bf16)

        def layer(fused: bool, unroll: int, x=x, weights=weights, ids=ids, flat=flat, gate=gate):
            if fused:
                rows = expert_cuda.expert_gemv(
                    x,
                    gate_up,
                    flat,
                    rows_per_input=top_k,
                    shared_weight=shared_gate_up,
                    unroll=unroll,
                )
                return expert_cuda.expert_down_sum(
                    rows, down, ids, weights, shared_gate=gate, shared_down=shared_down
                )
            shared = mlp(x, shared_mlp)
            rows = expert_cuda.expert_gemv(x, gate_up, flat, rows_per_input=top_k, unroll=unroll)
            return expert_cuda.expert_down_sum(
                rows, down, ids, weights, shared=shared, shared_gate=gate
            )

        twin = expert_ref.expert_down_sum(
            expert_ref.expert_gemv(
                x, gate_up, flat, rows_per_input=top_k, shared_weight=shared_gate_up
            ),
            down,
            ids,
            weights,
            shared_gate=gate,
            shared_down=shared_down,
        )
        fused_out = layer(True, expert_cuda.GEMV_UNROLL)
        err_separate = _rel(fused_out, layer(False, expert_cuda.GEMV_UNROLL))
        err_twin = _rel(fused_out, twin)
        separate_us = [_graph_us(lambda u=u: layer(False, u), replays=5) for u in unrolls]
        fused_us = [_graph_us(lambda u=u: layer(True, u), replays=5) for u in unrolls]
        gemv_us = [
            _graph_us(
                lambda u=u, x=x, flat=flat: expert_cuda.expert_gemv(
                    x, gate_up, flat, rows_per_input=top_k, unroll=u
                ),
                replays=5,
            )
            for u in unrolls
        ]
        moved = b * top_k * 2 * inter * hidden * 2
        lines.append(
            f"| {b} | "
            + " | ".join(f"{u:.1f}" for u in separate_us + fused_us)
            + " | "
            + " | ".join(f"{u:.1f} ({moved / u / 1e6:.2f})" for u in gemv_us)
            + f" | {err_separate:.1e} | {err_twin:.1e} |"
        )
    return "\n".join(lines)


def _quant_pages(pages: torch.Tensor, fmt: str) -> kv_formats.KvPages:
    """bf16 pages [N, P, Hk, D] stored in `fmt` (bf16 pages as they are)."""
    if fmt == kv_formats.PLAIN:
        return pages
    values, scale, blocks = kv_ref.quantize(pages, fmt)
    return kv_formats.QuantPages(fmt, values, scale, blocks)


def _heads(text: str, parser: argparse.ArgumentParser) -> tuple[int, int]:
    """'QxKV' (e.g. 16x2) as (q heads, KV heads), KV dividing Q; else a usage error."""
    parts = text.lower().split("x")
    if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
        q_heads, kv_heads = int(parts[0]), int(parts[1])
        if kv_heads > 0 and q_heads % kv_heads == 0:
            return q_heads, kv_heads
    parser.error(f"--attention-heads takes QxKV with KV dividing Q (e.g. 16x2), got {text!r}")
    raise AssertionError  # parser.error exits


def _kv_dtypes(text: str, parser: argparse.ArgumentParser) -> tuple[str, ...]:
    """Comma-separated `--kv-dtype` names; an unknown one is a usage error."""
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = [n for n in names if n not in kv_formats.KV_DTYPES]
    if unknown or not names:
        known = ",".join(kv_formats.KV_DTYPES)
        parser.error(f"--attention-kv-dtypes takes names of {known}, got {text!r}")
    return names


def _splits(text: str, parser: argparse.ArgumentParser) -> tuple[int | None, ...]:
    """Comma-separated tokens per split (powers of two >= 32) or `auto` (None: the plan)."""
    out: list[int | None] = []
    for part in (x.strip().lower() for x in text.split(",") if x.strip()):
        if part == "auto":
            out.append(None)
        elif part.isdigit() and int(part) >= 32 and int(part) & (int(part) - 1) == 0:
            out.append(int(part))
        else:
            parser.error(f"--attention-splits takes auto or powers of two >= 32, got {part!r}")
    if not out:
        parser.error("--attention-splits needs at least one split")
    return tuple(out)


def attention_sweep(
    contexts: Sequence[int],
    device: torch.device,
    batches: Sequence[int] = (1, 8),
    kv_dtypes: Sequence[str] = ("bf16", "fp8", "int8"),
    splits: Sequence[int | None] = (None, 64, 128, 256, 512),
    heads: tuple[int, int] = (24, 4),
) -> str:
    """µs per call (graphs) of the paged decode attention, `heads` = (q, KV) heads of 256 (the
    27B's 24 over 4 by default; the 35B-A3B's 16 over 2), tensor-core and CUDA-core partial
    kernels, for each KV dtype and split size (None: each kernel's own plan; the "auto" label
    shows the mma kernel's), with the KV bytes it must read over that time; each output is
    compared with the CUDA-core kernel at its plan. Splits the score memory cannot hold for
    the group are skipped. Beside the default mma call: two tiles per iteration ("x2"), the V
    prefetch forced on ("pf") and off ("no pf"), and the block combine where the warp one
    serves ("blk comb")."""
    q_heads, kv_heads = heads
    group = q_heads // kv_heads
    lines = [f"paged decode attention: {q_heads} q / {kv_heads} KV heads x 256, page 64"]
    lines.append(
        "| kv dtype | batch | context | split | mma µs | mma x2 µs | mma pf µs | mma no pf µs | "
        "mma blk comb µs | core µs | mma GB/s | mma err |"
    )
    lines.append("| --- | ---: | ---: | ---: " + "| ---: " * 8 + "|")
    page_size, dim = 64, 256
    for context in contexts:
        for b in batches:
            num_pages = -(-(context + 1) // page_size)
            base = torch.randn(b * num_pages, page_size, kv_heads, dim, device=device).bfloat16()
            v_base = torch.randn_like(base)
            table = torch.arange(b * num_pages, device=device).view(b, num_pages)
            lens = torch.full((b,), context + 1, dtype=torch.int64, device=device)
            q = torch.randn(b, q_heads, dim, device=device).bfloat16()
            capacity = num_pages * page_size
            auto = paged_cuda.mma_plan(b, kv_heads, group, capacity).tokens_per_split
            for kv_dtype in kv_dtypes:
                k_fmt, v_fmt = kv_formats.kv_formats(kv_dtype)
                k_pages, v_pages = _quant_pages(base, k_fmt), _quant_pages(v_base, v_fmt)
                per_token = kv_formats.bytes_per_token(kv_dtype, kv_heads, dim, torch.bfloat16)
                moved = b * (context + 1) * per_token
                attend = functools.partial(
                    paged_cuda.paged_decode_attention,
                    *(q, k_pages, v_pages, table, lens),
                    scale=dim**-0.5,
                )
                want = attend(tensor_cores=False)
                for split in splits:
                    if split is not None and split * group > paged_cuda.SCORE_FLOATS:
                        continue
                    us = {}
                    for variant in ("mma", "mma2", "pf", "nopf", "blk", "core"):
                        call = functools.partial(
                            attend,
                            tokens_per_split=split,
                            tensor_cores=variant != "core",
                            mma_tiles=2 if variant == "mma2" else 1,
                            prefetch_v={"pf": True, "nopf": False}.get(variant),
                            warp_combine=variant != "blk",
                        )
                        us[variant] = _graph_us(call, replays=5)
                    err = _rel(attend(tokens_per_split=split), want)
                    label = f"{auto} (auto)" if split is None else str(split)
                    lines.append(
                        f"| {kv_dtype} | {b} | {context} | {label} | {us['mma']:.1f} | "
                        f"{us['mma2']:.1f} | {us['pf']:.1f} | {us['nopf']:.1f} | {us['blk']:.1f} | "
                        f"{us['core']:.1f} | {moved / us['mma'] / 1e3:.0f} | {err:.1e} |"
                    )
    return "\n".join(lines)


def int4_sweep(
    row_counts: Sequence[int], device: torch.device, shape: tuple[int, int] = (131072, 5120)
) -> str:
    """µs per call (graphs) of the int4 kernels and of F.linear over the dequantized bf16 rows, on
    the 27B `--lm-head-draft` shortlist (131,072 x 5120), bf16 x of each row count: the CUDA-core
    GEMV (rows <= 8) and the tensor-core `int4_mma` (rows <= 64) beside each other; "-" where a
    kernel does not take the row count.

    GB/s: the bytes each side must read (nibbles + fp32 scales, or the bf16 rows) over its time;
    each kernel's logits are checked against the twin (fp32) before timing (rel err: the larger).
    """
    num_out, hidden = shape
    packed = torch.randint(0, 256, (num_out, hidden // 2), dtype=torch.uint8, device=device)
    scale = torch.rand(num_out, hidden // 64, device=device) * 0.05 + 1e-3
    weight = int4_ref.dequantize(packed, scale).to(torch.bfloat16)
    int4_bytes = packed.numel() + scale.numel() * 4
    bf16_bytes = weight.numel() * 2
    lines = [f"int4 GEMV, shortlist {num_out} x {hidden} (bf16 x, fp32 logits)"]
    lines.append(
        "| rows | CUDA-core µs | mma µs | mma GB/s | bf16 F.linear µs | bf16 GB/s | "
        "F.linear / best int4 | rel err |"
    )
    lines.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in row_counts:
        x = torch.randn(m, hidden, device=device).to(torch.bfloat16)
        twin = int4_ref.int4_linear(x, packed, scale)
        timed: dict[bool, float] = {}
        err = 0.0
        for tensor_cores in (False, True):
            limit = int4_cuda.MMA_MAX_ROWS if tensor_cores else int4_cuda.MAX_ROWS
            if m > limit:
                continue

            def call(x=x, tc=tensor_cores):
                return int4_cuda.int4_linear(x, packed, scale, tensor_cores=tc)

            err = max(err, _rel(call(), twin))
            timed[tensor_cores] = _graph_us(call, replays=5)
        linear_us = _graph_us(lambda x=x: torch.nn.functional.linear(x, weight), replays=5)
        core = f"{timed[False]:.1f}" if False in timed else "-"
        mma = f"{timed[True]:.1f}" if True in timed else "-"
        mma_gbs = f"{int4_bytes / timed[True] / 1e3:.0f}" if True in timed else "-"
        best = min(timed.values()) if timed else float("nan")
        lines.append(
            f"| {m} | {core} | {mma} | {mma_gbs} | {linear_us:.1f} | "
            f"{bf16_bytes / linear_us / 1e3:.0f} | {linear_us / best:.2f} | {err:.1e} |"
        )
    return "\n".join(lines)


# N x K of the decode projections: 35B-A3B out_proj / o_proj, DeltaNet in_proj (merged), attention
# qkv (merged), shared expert gate-up and down, and an odd N; 27B out_proj / o_proj, MLP down,
# MLP gate-up (merged), DeltaNet in_proj (merged), attention qkv (merged)
GEMV_SHAPES = (
    (2048, 4096),
    (12352, 2048),
    (9216, 2048),
    (1024, 2048),
    (2048, 512),
    (257, 2048),
    (5120, 6144),
    (5120, 17408),
    (34816, 5120),
    (16480, 5120),
    (14336, 5120),
)
GEMV_ROTATE_BYTES = 256 << 20  # weight copies a bf16 GEMV sweep cycles through (cold L2)
GEMV_MAX_COPIES = 256


def _parse_shape(text: str) -> tuple[int, int]:
    """An `NxK` weight shape (N out features, K in features), e.g. 2048x4096."""
    n, k = text.strip().lower().split("x")
    return int(n), int(k)


def bf16_gemv_sweep(
    shapes: Sequence[tuple[int, int]], row_counts: Sequence[int], device: torch.device
) -> str:
    """µs per call (graphs) of the bf16 GEMV kernel (1..8 rows), of the tensor-core skinny GEMM
    `bf16_mma_gemv` in each compiled variant (1..64 rows) and of `F.linear` (cuBLAS) for bf16 x
    of each row count against each W [N, K], with the weight bytes each streams per µs (GB/s),
    cuBLAS's time over the best kernel's, what dispatch routes today and the kernels' worst error
    against an fp64 product.

    Weights come from DRAM as in a decode step (where every other layer's weights pass through
    L2 between two calls of one projection): each captured call reads the next of enough random
    copies of W to span GEMV_ROTATE_BYTES, five times the H200's 50 MB L2, so no call finds its
    weights there. Plan columns: the GEMV's R rows per warp group / warps splitting K / blocks;
    the mma kernel's (default variant) row tiles x K splits. Variant columns: `16r d4` = 16
    weight rows per warp (MT = 1), ring depth 4.
    """
    variants = bf16_mma_cuda.VARIANTS
    names = [f"mma {16 * mt}r d{d} µs" for mt, d in variants]
    lines = [
        "bf16 GEMV and bf16 mma GEMV vs F.linear (bf16 x, W [N, K], bf16 out), graphs, cold L2"
    ]
    lines.append(
        "| N x K | rows | gemv plan | gemv µs | mma plan | "
        + " | ".join(names)
        + " | best GB/s | F.linear µs | F.linear GB/s | speedup | routed | rel err |"
    )
    lines.append(
        "| --- | ---: | --- | ---: | --- | "
        + "---: | " * len(names)
        + "---: | ---: | ---: | ---: | --- | ---: |"
    )
    index = device.index if device.index is not None else torch.cuda.current_device()
    sms = torch.cuda.get_device_properties(index).multi_processor_count
    for n, k in shapes:
        moved = n * k * 2
        weights = bf16_weight_copies(
            n, k, device, rotate_bytes=GEMV_ROTATE_BYTES, max_copies=GEMV_MAX_COPIES
        )
        calls = max(CALLS_PER_GRAPH, len(weights))
        for m in row_counts:
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            exact = x.double() @ weights[0].double().T

            def err_of(got: torch.Tensor, exact: torch.Tensor = exact) -> float:
                return ((got.double() - exact).norm() / exact.norm()).item()

            errors = []
            gemv_plan, gemv_us = "–", float("nan")
            if m <= bf16_gemv_cuda.MAX_ROWS:
                errors.append(err_of(bf16_gemv_cuda.bf16_linear(x, weights[0])))
                gemv_us = _graph_us(
                    _rotating(lambda w, x=x: bf16_gemv_cuda.bf16_linear(x, w), weights), 5, calls
                )
                p = bf16_gemv_cuda.plan(m, n, k, sms)
                gemv_plan = f"{p.rows_per_group}/{1 << p.ks_log2}/{p.blocks}"
            mma_us = []
            if m <= bf16_mma_cuda.MAX_ROWS:
                for mt, d in variants:
                    kw = {"m_tiles": mt, "depth": d}
                    errors.append(err_of(bf16_mma_cuda.bf16_linear(x, weights[0], **kw)))
                    mma_us.append(
                        _graph_us(
                            _rotating(
                                lambda w, x=x, kw=kw: bf16_mma_cuda.bf16_linear(x, w, **kw),
                                weights,
                            ),
                            5,
                            calls,
                        )
                    )
                q = bf16_mma_cuda.plan(m, n, k, sms)
                mma_plan = f"{q.tiles}x{q.splits}"
            else:
                mma_plan = "–"
                mma_us = [float("nan")] * len(variants)
            linear_us = _graph_us(
                _rotating(lambda w, x=x: torch.nn.functional.linear(x, w), weights), 5, calls
            )
            best = min((u for u in [gemv_us, *mma_us] if u == u), default=float("nan"))
            if bf16_gemv_cuda.bf16_gemv_preferred(m, n, k):
                routed = "gemv"
            elif bf16_mma_cuda.mma_preferred(m, n, k):
                routed = "mma"
            else:
                routed = "cuBLAS"
            cells = " | ".join("–" if u != u else f"{u:.1f}" for u in mma_us)
            lines.append(
                f"| {n}x{k} | {m} | {gemv_plan} | "
                f"{'–' if gemv_us != gemv_us else f'{gemv_us:.1f}'} | {mma_plan} | {cells} | "
                f"{moved / best / 1e3:.0f} | {linear_us:.1f} | {moved / linear_us / 1e3:.0f} | "
                f"{linear_us / best:.2f} | {routed} | {max(errors, default=0.0):.1e} |"
            )
        del weights
        torch.cuda.empty_cache()
    return "\n".join(lines)


if __name__ == "__main__":
    main()
