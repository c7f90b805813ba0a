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

from ninfer.bench.results import KernelShare, MatmulShape, StepProfile

# Substrings of the names cuBLAS / CUTLASS give their matmul kernels.
_MATMUL_MARKERS = ("gemm", "gemv", "cutlass", "xmma", "cublas", "nvjet")
# torch ops whose kernels are matmuls, and where their two operands' shapes sit in input_shapes
_MATMUL_OPS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1)}

# (op, input shapes, calls, device µs) of the torch matmul ops in a profile
ShapeRow = tuple[str, list[list[int]], int, float]


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
    shapes: Iterable[ShapeRow] = (),
    top_shapes: int = 8,
) -> StepProfile:
    """Group (name, calls, total µs) rows over `num_steps` steps into a per-step profile, and the
    matmul ops by input shape (`profile_steps(shapes=...)`) with the TFLOP/s each ran at."""
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
    matmuls = sorted(
        (m for m in (_matmul_shape(row, num_steps) for row in shapes) if m is not None),
        key=lambda m: m.us_per_step,
        reverse=True,
    )
    return StepProfile(
        batch=batch,
        context=context,
        kernel_us=total,
        matmul_us=matmul,
        num_kernels=sum(calls for _, calls, _ in rows) / num_steps,
        top=shares,
        kind=kind,
        matmuls=matmuls[:top_shapes],
    )


def _matmul_shape(row: ShapeRow, num_steps: int) -> MatmulShape | None:
    """One (op, input shapes, calls, µs) row as a MatmulShape, or None if it is no plain matmul."""
    op, input_shapes, calls, us = row
    where = _MATMUL_OPS.get(op)
    if where is None or us <= 0 or calls <= 0 or len(input_shapes) <= max(where):
        return None
    a, b = (input_shapes[i] for i in where)
    if len(a) != len(b) or len(a) not in (2, 3) or a[-1] != b[-2]:
        return None
    batch = a[0] if len(a) == 3 else 1
    m, k, n = a[-2], a[-1], b[-1]
    prefix = f"{batch} x " if len(a) == 3 else ""
    return MatmulShape(
        op=op,
        shape=f"{prefix}{m} x {k} @ {k} x {n}",
        calls_per_step=calls / num_steps,
        us_per_step=us / num_steps,
        tflops=2.0 * batch * m * n * k * calls / (us * 1e6),
    )


def profile_steps(
    step: Callable[[], object],
    num_steps: int,
    device_type: str,
    *,
    shapes: list[ShapeRow] | None = None,
) -> list[tuple[str, int, float]]:
    """(name, calls, device µs) per kernel over `num_steps` calls of `step` (after one warm-up).

    With a `shapes` list, the torch matmul ops' (op, input shapes, calls, device µs) are appended
    to it too (the profile then records input shapes).
    """
    step()
    activities = [ProfilerActivity.CUDA] if device_type == "cuda" else [ProfilerActivity.CPU]
    if shapes is not None and device_type == "cuda":
        activities.append(ProfilerActivity.CPU)  # the ops that carry the shapes
    with profile(activities=activities, record_shapes=shapes is not None) as prof:
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
    if shapes is not None:
        for avg in prof.key_averages(group_by_input_shape=True):
            if avg.key not in _MATMUL_OPS:
                continue
            if device_type == "cuda":
                us = getattr(avg, "device_time_total", None)
                if us is None:
                    us = getattr(avg, "cuda_time_total", 0.0)
            else:
                us = avg.cpu_time_total
            shapes.append((avg.key, [list(s) for s in avg.input_shapes], avg.count, float(us)))
    return out
