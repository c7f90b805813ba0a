"""`ninfer bench --kv-dtype-quality`: what each quantized KV dtype costs in logits, and its decode.

Imports torch, model/ and bench siblings. For each context L, one random prompt of L tokens is
prefilled (chunks of `chunk`) into a fresh cache of each KV dtype, the last `query_tokens` prompt
positions returning their logits (the prefill attention path), then `decode_steps` teacher-forced
decode steps (the paged decode kernel). Against the bf16 cache's logits of the same positions:
top-1 agreement (argmax equal) and the mean KL(p_bf16 || p_kv) per row, prefill and decode rows
apart. Optionally the median graph-replayed decode step of batch 1 at L per dtype. Random
weights: the numbers compare dtypes with each other, not with a trained model's quality.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch

from ninfer.bench.model_bench import PAGE_SIZE, ModelBench
from ninfer.kernels.kv_quant.formats import bytes_per_token
from ninfer.model.batch import ForwardBatch
from ninfer.model.cache import ModelCache
from ninfer.model.qwen3_5 import Qwen3_5Model

KV_DTYPES = ("int8", "fp8", "nvfp4", "k8v4")


@dataclass(frozen=True)
class KvQualityResult:
    kv_dtype: str
    context: int
    kv_bytes_per_token: int  # every full-attention layer, scales included
    prefill_top1: float  # share of the last query_tokens prompt rows whose argmax matches bf16 KV
    prefill_kl: float  # mean KL(bf16 || kv dtype) of those rows, nats
    decode_top1: float
    decode_kl: float
    decode_tok_s: float | None  # batch 1 at this context, graph-replayed; None when not timed
    bf16_decode_tok_s: float | None


def _logits(
    model: Qwen3_5Model,
    kv_dtype: str,
    ids: list[int],
    *,
    query_tokens: int,
    decode_steps: int,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefill rows [query_tokens, V], decode rows [decode_steps, V]) fp32 logits."""
    prompt = len(ids) - decode_steps
    num_pages = -(-len(ids) // PAGE_SIZE)
    cache = ModelCache.allocate(
        model.config, num_pages=num_pages, num_slots=1, page_size=PAGE_SIZE,
        dtype=model.dtype, device=model.device, kv_dtype=kv_dtype,
    )  # fmt: skip
    pages = list(range(num_pages))
    body = prompt - query_tokens
    for begin in range(0, body, chunk):
        batch = ForwardBatch.prefill(
            ids[begin : min(body, begin + chunk)], num_computed=begin, page_ids=pages,
            state_slot=0, device=model.device,
        )  # fmt: skip
        model.forward(batch, cache)
    batch = ForwardBatch.prefill(
        ids[body:prompt], num_computed=body, page_ids=pages, state_slot=0, device=model.device
    )
    prefill_rows = model.forward(batch, cache, all_logits=True).float()
    decode_rows = []
    for pos in range(prompt, len(ids)):
        batch = ForwardBatch.decode(
            ids[pos : pos + 1], num_computed=[pos], page_tables=[pages], state_slots=[0],
            device=model.device,
        )  # fmt: skip
        decode_rows.append(model.forward(batch, cache).float())
    del cache
    return prefill_rows, torch.cat(decode_rows)


def _compare(want: torch.Tensor, got: torch.Tensor) -> tuple[float, float]:
    """(top-1 agreement, mean KL(want || got)) over rows."""
    top1 = (want.argmax(-1) == got.argmax(-1)).float().mean().item()
    logp, logq = want.log_softmax(-1), got.log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1).mean().item()
    return top1, kl


def _decode_tok_s(model: Qwen3_5Model, kv_dtype: str, context: int, steps: int) -> float | None:
    """Median graph-replayed batch-1 decode step at `context`, or None without graphs."""
    bench = ModelBench(
        model, max_batch=1, max_seq_tokens=context + steps + 8,
        max_total_tokens=context + steps + 8, kv_dtype=kv_dtype,
    )  # fmt: skip
    try:
        if bench.graphs is None:
            return None
        return bench.decode(1, context, steps=steps, use_graphs=True).tok_per_s
    finally:
        del bench
        gc.collect()
        torch.cuda.empty_cache()


def run_kv_quality(
    model: Qwen3_5Model,
    *,
    contexts: Sequence[int] = (4096, 32768),
    kv_dtypes: Sequence[str] = KV_DTYPES,
    query_tokens: int = 64,
    decode_steps: int = 16,
    chunk: int = 4096,
    timed_steps: int = 32,
    time_decode: bool = True,
    seed: int = 0,
    on_progress: Callable[[str], None] = lambda _msg: None,
) -> list[KvQualityResult]:
    """One row per (context, quantized KV dtype); see the module docstring."""
    config = model.config
    per_token = {
        k: len(config.full_attention_layers)
        * bytes_per_token(k, config.num_key_value_heads, config.head_dim, model.dtype)
        for k in kv_dtypes
    }
    results = []
    for context in contexts:
        if context <= query_tokens:
            raise ValueError(f"context {context} must exceed query_tokens {query_tokens}")
        gen = torch.Generator().manual_seed(seed + context)
        ids = torch.randint(0, config.vocab_size, (context + decode_steps,), generator=gen)
        ids = ids.tolist()
        run = partial(
            _logits, model, ids=ids, query_tokens=query_tokens, decode_steps=decode_steps,
            chunk=chunk,
        )  # fmt: skip
        on_progress(f"kv quality: bf16 reference at {context} tokens")
        ref_prefill, ref_decode = run("bf16")
        ref_tok_s = _decode_tok_s(model, "bf16", context, timed_steps) if time_decode else None
        for kv_dtype in kv_dtypes:
            on_progress(f"kv quality: {kv_dtype} at {context} tokens")
            prefill, decode = run(kv_dtype)
            p_top1, p_kl = _compare(ref_prefill, prefill)
            d_top1, d_kl = _compare(ref_decode, decode)
            tok_s = _decode_tok_s(model, kv_dtype, context, timed_steps) if time_decode else None
            results.append(
                KvQualityResult(
                    kv_dtype,
                    context,
                    per_token[kv_dtype],
                    p_top1,
                    p_kl,
                    d_top1,
                    d_kl,
                    tok_s,
                    ref_tok_s,
                )  # fmt: skip
            )
    return results
