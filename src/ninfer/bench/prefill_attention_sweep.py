"""Prefill attention of a continued chunk on the 27B's heads: one lower-right flash call against
the cuDNN prefix + own split merged by log-sum-exp (model/layers/split_attention.py), for
`python -m ninfer.bench.kernel_bench --prefill-attention 8192x32768,...`; and what the first call
of a length the process has not seen costs (`--attention-first-calls`), the stall a server's
request meets when cuDNN builds a plan for it (model/layers/cudnn_plans.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch
from torch.nn.attention.bias import causal_lower_right

from ninfer.bench.ceilings import _median_ms
from ninfer.model.layers.cudnn_plans import AVOID_RECOMPILE
from ninfer.model.layers.gated_attention import _sdpa_grouped, fresh_causal_attention
from ninfer.model.layers.split_attention import split_prefix_attention

HEADS = (24, 4, 256)  # 27B: query heads, KV heads, head dim


def prefill_attention_sweep(shapes: Sequence[tuple[int, int]], device: torch.device) -> str:
    """Markdown table: ms per layer call and TFLOP/s of the causal work, per (queries, keys)."""
    hq, hk, d = HEADS
    lines = [
        "| queries x keys | flash lower-right ms | TFLOP/s | split (cuDNN) ms | TFLOP/s | "
        "max abs diff |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    gen = torch.Generator(device=device).manual_seed(0)
    for n, length in shapes:
        lines.append(_row(n, length, device, gen))
    return "\n".join(lines)


def _operands(
    n: int, length: int, device: torch.device, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random bf16 q [n, Hq, D] and k, v [length, Hk, D] on the 27B's heads."""
    hq, hk, d = HEADS
    q = torch.randn(n, hq, d, device=device, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(length, hk, d, device=device, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(length, hk, d, device=device, dtype=torch.bfloat16, generator=gen)
    return q, k, v


def _row(n: int, length: int, device: torch.device, gen: torch.Generator) -> str:
    hq, _, d = HEADS
    q, k, v = _operands(n, length, device, gen)
    scale = d**-0.5
    flops = 4 * hq * d * (n * (length - n) + n * n / 2)
    bias = causal_lower_right(n, length)

    def one() -> torch.Tensor:
        return _sdpa_grouped(q, k, v, scale=scale, attn_mask=bias)

    def split() -> torch.Tensor | None:
        return split_prefix_attention(q, k, v, scale=scale)

    ref, got = one(), split()
    t_one = _median_ms(one, 5)
    if got is None:
        return f"| {n} x {length} | {t_one:.2f} | {flops / t_one / 1e9:.0f} | n/a | | |"
    t_split = _median_ms(split, 5)
    diff = (got.float() - ref.float()).abs().max().item()
    return (
        f"| {n} x {length} | {t_one:.2f} | {flops / t_one / 1e9:.0f} | {t_split:.2f} | "
        f"{flops / t_split / 1e9:.0f} | {diff:.1e} |"
    )


def first_call_sweep(shapes: Sequence[tuple[int, int]], device: torch.device) -> str:
    """Markdown table: the first call of each (queries, keys) shape, in the order given, against
    the median of the next five, through the model's own paths (queries == keys: a fresh causal
    prefill; more keys: the split form). Run it in a fresh process: the first call of each
    variant also loads its kernels, and whether plans are length-free follows the process's
    TORCH_CUDNN_SDPA_AVOID_RECOMPILE (set by cudnn_plans unless the caller set it)."""
    value = os.environ.get(AVOID_RECOMPILE)
    mode = "length-free" if value == "1" else "per-shape"
    lines = [
        f"cuDNN plans: {mode} ({AVOID_RECOMPILE}={value})",
        "",
        "| queries x keys | path | first call ms | warm ms (median of 5) |",
        "| --- | --- | ---: | ---: |",
    ]
    gen = torch.Generator(device=device).manual_seed(0)
    for n, length in shapes:
        lines.append(_first_call_row(n, length, device, gen))
    return "\n".join(lines)


def _first_call_row(n: int, length: int, device: torch.device, gen: torch.Generator) -> str:
    if length < n:
        raise ValueError(f"{n}x{length}: a chunk's queries are among its keys (keys >= queries)")
    d = HEADS[2]
    q, k, v = _operands(n, length, device, gen)
    fresh = length == n

    def call() -> object:
        if fresh:
            return fresh_causal_attention(q, k, v, scale=d**-0.5)
        return split_prefix_attention(q, k, v, scale=d**-0.5)

    torch.cuda.synchronize(device)
    start = time.perf_counter()
    call()
    torch.cuda.synchronize(device)
    first = (time.perf_counter() - start) * 1e3
    path = "fresh causal" if fresh else "split"
    return f"| {n} x {length} | {path} | {first:.1f} | {_median_ms(call, 5):.3f} |"
