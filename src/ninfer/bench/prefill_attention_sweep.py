"""Prefill attention of a continued chunk on the 27B's heads: one lower-right flash call against
the cuDNN prefix + own split merged by log-sum-exp (model/layers/split_attention.py), for
`python -m ninfer.bench.kernel_bench --prefill-attention 8192x32768,...`."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn.attention.bias import causal_lower_right

from ninfer.bench.ceilings import _median_ms
from ninfer.model.layers.gated_attention import _sdpa_grouped
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


def _row(n: int, length: int, device: torch.device, gen: torch.Generator) -> str:
    hq, hk, d = HEADS
    q = torch.randn(n, hq, d, device=device, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(length, hk, d, device=device, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(length, hk, d, device=device, dtype=torch.bfloat16, generator=gen)
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
