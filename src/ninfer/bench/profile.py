"""Where a decode step's device time goes: kernels grouped by name, matmuls apart from the rest.

Imports torch and bench siblings. Profiles eager steps (a graph replay runs the same kernels, minus
the launch gaps), so the sum of kernel times is what the graph can at best shrink to, and the
matmul share against the rest is the first split the performance notes need.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from ninfer.bench.results import KernelShare, StepProfile

# Substrings of the names cuBLAS / CUTLASS give their matmul kernels.
_MATMUL_MARKERS = ("gemm", "gemv", "cutlass", "xmma", "cublas", "nvjet")


def is_matmul(name: str) -> bool:
    lowered = name.lower()
    return any(marker in lowered for marker in _MATMUL_MARKERS)


def summarize(
    events: Iterable[tuple[str, int, float]],
    num_steps: int,
    *,
    batch: int,
    context: int,
    top: int = 12,
    kind: str = "decode",
) -> StepProfile:
    """Group (name, calls, total µs) rows over `num_steps` steps into a per-step profile."""
    rows = [(name, calls, us) for name, calls, us in events if us > 0]
    total = sum(us for _, _, us in rows) / num_steps
    matmul = sum(us for name, _, us in rows if is_matmul(name)) / num_steps
    rows.sort(key=lambda r: r[2], reverse=True)
    shares = [
        KernelShare(
            name=name[:90],
            calls_per_step=calls / num_steps,
            us_per_step=us / num_steps,
            share=(us / num_steps) / total if total else 0.0,
        )
        for name, calls, us in rows[:top]
    ]
    return StepProfile(
        batch=batch,
        context=context,
        kernel_us=total,
        matmul_us=matmul,
        num_kernels=sum(calls for _, calls, _ in rows) / num_steps,
        top=shares,
        kind=kind,
    )


def profile_steps(
    step: Callable[[], object], num_steps: int, device_type: str
) -> list[tuple[str, int, float]]:
    """(name, calls, device µs) per kernel over `num_steps` calls of `step` (after one warm-up)."""
    step()
    activities = [ProfilerActivity.CUDA] if device_type == "cuda" else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        for _ in range(num_steps):
            step()
        if device_type == "cuda":
            torch.cuda.synchronize()
    out = []
    for avg in prof.key_averages():
        if device_type == "cuda":
            if avg.device_type != DeviceType.CUDA:  # host-side ops and runtime calls
                continue
            us = getattr(avg, "self_device_time_total", None)
            if us is None:  # older torch spelling
                us = getattr(avg, "self_cuda_time_total", 0.0)
        else:
            us = avg.self_cpu_time_total  # self time: nested ops are not counted twice
        out.append((avg.key, avg.count, float(us)))
    return out
