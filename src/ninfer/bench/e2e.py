"""`ninfer bench --e2e`: what users feel, through the public `Engine` API on a bound model.

Imports torch, the public api and bench siblings. Per decode batch B, B requests of a fixed
random prompt length and output length (greedy, EOS ignored) are submitted at once through
`Engine.agenerate` on one asyncio loop, as the server drives the engine. Steady-state tok/s counts
the tokens committed while every request is decoding (from the last first token to the first last
token), which is what the raw graph step measures; time to first token and whole-run tok/s are
reported beside it. The interference run measures inter-token gaps of B running streams before
and while one long prompt is prefilled.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from ninfer.api import Engine
from ninfer.bench.results import E2eResult, InterferenceResult
from ninfer.engine.graphs import buckets_up_to
from ninfer.model.qwen3_5 import Qwen3_5Model

PAGE_SIZE = 64


def _prompt(n: int, vocab: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(vocab, 200_000), (n,), generator=g).tolist()


async def _stream(engine: Engine, prompt: list[int], max_tokens: int, times: list[float]) -> None:
    async for ev in engine.agenerate(prompt, max_tokens=max_tokens, ignore_eos=True, greedy=True):
        if ev.token_ids:
            times.extend([time.perf_counter()] * len(ev.token_ids))


def _engine(model: Qwen3_5Model, architecture: str, batch: int, max_context: int, chunk: int):
    pages = -(-max_context // PAGE_SIZE)
    return Engine.from_model(
        model,
        architecture=architecture,
        max_concurrency=batch,
        max_pending_requests=batch + 1,
        max_context=max_context,
        kv_capacity=(batch + 1) * pages * PAGE_SIZE,
        device_state_slots=1,
        prefill_chunk=chunk,
        pending_timeout_ms=600_000,
    )


def _warm(engine: Engine, batch: int, min_tokens: int, max_tokens: int) -> None:
    """Capture every decode graph the run will replay (rows holding min..max tokens), and warm
    the prefill path once."""
    decode = engine.core.runner.decode  # type: ignore[attr-defined]
    first, last = -(-min_tokens // PAGE_SIZE), -(-max_tokens // PAGE_SIZE)
    widths = sorted({decode.width_for(n) for n in range(first, last + 1)})
    for size in buckets_up_to(batch):
        for width in widths:
            decode.capture(size, width)
    warm = _prompt(min(300, max_tokens - 8), engine.config.vocab_size, 1)
    list(engine.generate(warm, max_tokens=2, greedy=True))


def run_batch(
    model: Qwen3_5Model,
    architecture: str,
    batch: int,
    *,
    prompt_tokens: int,
    output_tokens: int,
    prefill_chunk: int,
) -> E2eResult:
    max_context = prompt_tokens + output_tokens + 8
    engine = _engine(model, architecture, batch, max_context, prefill_chunk)
    try:
        _warm(engine, batch, prompt_tokens + 1, max_context)
        prompts = [_prompt(prompt_tokens, model.config.vocab_size, 10 + i) for i in range(batch)]
        times: list[list[float]] = [[] for _ in range(batch)]

        async def main() -> float:
            start = time.perf_counter()
            await asyncio.gather(
                *(_stream(engine, p, output_tokens, t) for p, t in zip(prompts, times, strict=True))
            )
            return start

        start = asyncio.run(main())
    finally:
        engine.close()
    first = max(t[0] for t in times)
    last = min(t[-1] for t in times)
    in_window = sum(1 for ts in times for t in ts if first < t <= last)
    ttfts = [(t[0] - start) * 1000.0 for t in times]
    end = max(t[-1] for t in times)
    return E2eResult(
        batch=batch,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        steady_tok_per_s=in_window / (last - first) if last > first else 0.0,
        wall_tok_per_s=sum(len(t) for t in times) / (end - start),
        ttft_ms_p50=statistics.median(ttfts),
        ttft_ms_max=max(ttfts),
    )


def run_interference(
    model: Qwen3_5Model,
    architecture: str,
    batch: int,
    *,
    long_prompt: int,
    prefill_chunk: int,
    stream_tokens: int = 384,
) -> InterferenceResult:
    """B streams decode; when each has made 64 tokens, one `long_prompt`-token request arrives."""
    max_context = max(long_prompt + 8, 256 + stream_tokens)
    engine = _engine(model, architecture, batch + 1, max_context, prefill_chunk)
    vocab = model.config.vocab_size
    try:
        _warm(engine, batch + 1, 257, 256 + stream_tokens)
        chunk_ms = min(_time_prefill(engine, prefill_chunk) for _ in range(3))  # first: warm-up
        times: list[list[float]] = [[] for _ in range(batch)]
        marks: dict[str, float] = {}

        async def main() -> None:
            streams = [
                asyncio.create_task(_stream(engine, _prompt(256, vocab, 50 + i), stream_tokens, t))
                for i, t in enumerate(times)
            ]
            while min(len(t) for t in times) < 64:
                await asyncio.sleep(0.005)
            marks["arrive"] = time.perf_counter()
            long_times: list[float] = []
            await _stream(engine, _prompt(long_prompt, vocab, 99), 1, long_times)
            marks["first"] = long_times[0]
            await asyncio.gather(*streams)

        asyncio.run(main())
    finally:
        engine.close()
    before, during = [], []
    for ts in times:
        for a, b in zip(ts, ts[1:], strict=False):
            gap = (b - a) * 1000.0
            if b <= marks["arrive"]:
                before.append(gap)
            elif a >= marks["arrive"] and b <= marks["first"]:
                during.append(gap)
    during = during or [0.0]
    return InterferenceResult(
        batch=batch,
        long_prompt=long_prompt,
        prefill_chunk=prefill_chunk,
        itl_p50_ms_before=_pct(before, 50),
        itl_p99_ms_before=_pct(before, 99),
        itl_p50_ms_during=_pct(during, 50),
        itl_p99_ms_during=_pct(during, 99),
        itl_max_ms_during=max(during),
        chunk_prefill_ms=chunk_ms,
    )


def _time_prefill(engine: Engine, num_tokens: int) -> float:
    """Milliseconds to first token of one `num_tokens` prompt alone (one budgeted chunk)."""
    prompt = _prompt(num_tokens, engine.config.vocab_size, 7)
    start = time.perf_counter()
    for ev in engine.generate(prompt, max_tokens=1, greedy=True):
        if ev.token_ids:
            return (time.perf_counter() - start) * 1000.0
    return (time.perf_counter() - start) * 1000.0


def _pct(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100.0 * (len(ordered) - 1)))]


def run_e2e(
    model: Qwen3_5Model,
    architecture: str,
    batches: Sequence[int],
    *,
    prompt_tokens: int = 1000,
    output_tokens: int = 256,
    prefill_chunk: int = 1024,
    long_prompt: int = 8192,
    on_progress: Callable[[str], None] = lambda _: None,
) -> tuple[list[E2eResult], InterferenceResult | None]:
    results = []
    for b in batches:
        on_progress(f"end to end: batch {b}, {prompt_tokens}-token prompts, {output_tokens} out")
        results.append(
            run_batch(
                model,
                architecture,
                b,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                prefill_chunk=prefill_chunk,
            )
        )
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    interference = None
    if long_prompt:
        b = min(8, max(batches))
        on_progress(f"end to end: a {long_prompt}-token prompt arriving while {b} streams decode")
        interference = run_interference(
            model, architecture, b, long_prompt=long_prompt, prefill_chunk=prefill_chunk
        )
    return results, interference
