"""The two machine ceilings every performance claim is held against: copy bandwidth, bf16 GEMM.

Imports only torch. Timed with CUDA events after a warm-up, on random data (a GEMM on zeros ran
13% faster on this card), median of several runs; sizes far larger than the 60 MB L2.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from ninfer.bench.results import Ceilings


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _copy_ms(device: torch.device, num_bytes: int) -> float:
    src = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return _median_ms(lambda: dst.copy_(src), 10)


def _gemm_ms(device: torch.device, n: int) -> float:
    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    return _median_ms(lambda: a @ b, 10)


def measure_ceilings(
    device: torch.device, *, copy_gib: float = 2.0, gemm_n: int = 8192
) -> Ceilings:
    num_bytes = int(copy_gib * 2**30)
    copy_ms = _copy_ms(device, num_bytes)
    gemm_ms = _gemm_ms(device, gemm_n)
    torch.cuda.empty_cache()
    return Ceilings(
        copy_tb_s=2 * num_bytes / (copy_ms * 1e-3) / 1e12,
        gemm_tflops=2 * gemm_n**3 / (gemm_ms * 1e-3) / 1e12,
    )
