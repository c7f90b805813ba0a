"""The tensor-core fp8 GEMV's two forms (weights in flight in registers, or in a cp.async ring of
2-4 stages) on decode shapes, for `python -m ninfer.bench.kernel_bench --fp8-shapes`: which form
`launch_tc.RING_STAGES` should route per x row count, and how far each is from the copy ceiling.

Weights come from DRAM as in a decode step: each captured call reads the next of enough fp8
weight copies to span five times the H200's 50 MB L2.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from ninfer.artifact.quantize import quantize_fp8_block
from ninfer.bench.gpu_timing import CALLS_PER_GRAPH, graph_us
from ninfer.kernels.fp8_gemv import launch_tc as tc_cuda
from ninfer.kernels.fp8_gemv import reference as fp8_ref
from ninfer.kernels.fp8_gemv.reference import Fp8Weight

ROTATE_BYTES = 250 * 2**20
MAX_COPIES = 64
# 27B decode projections: gate-up, down, DeltaNet in_proj, out / o_proj, attention qkv
SHAPES = ((34816, 5120), (5120, 17408), (16480, 5120), (5120, 6144), (14336, 5120))


def fp8_gemv_sweep(
    shapes: Sequence[tuple[int, int]], row_counts: Sequence[int], device: torch.device
) -> str:
    """Markdown table: µs per call of each form at its automatic split count, the best form's
    weight GB/s, what dispatch routes now, and the worst relative error against an fp64 product
    (all forms must agree bit for bit: the same mma in the same order)."""
    forms = (0, *tc_cuda.STAGES)
    names = ["registers µs", *(f"ring {s} µs" for s in tc_cuda.STAGES)]
    lines = [
        "fp8 tensor-core GEMV forms (bf16 x, e4m3 W [N, K] with 128x128 scales), graphs, cold L2",
        "| N x K | rows | splits | " + " | ".join(names) + " | best GB/s | routed | rel err |",
        "| --- | ---: | ---: | " + "---: | " * len(names) + "---: | --- | ---: |",
    ]
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    for n, k in shapes:
        w = torch.randn(n, k, device=device) * k**-0.5
        weights = [Fp8Weight(*quantize_fp8_block(w))]
        del w
        moved = n * k
        copies = min(MAX_COPIES, -(-ROTATE_BYTES // moved))
        for _ in range(copies - 1):
            first = weights[0]
            weights.append(Fp8Weight(first.weight.clone(), first.scale_inv.clone()))
        calls = max(CALLS_PER_GRAPH, copies)
        for m in row_counts:
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            exact = (
                x.double()
                @ fp8_ref.dequantize(weights[0].weight, weights[0].scale_inv, torch.float64).T
            )
            outs = [tc_cuda.fp8_linear(x, weights[0], stages=s) for s in forms]
            same = all(torch.equal(outs[0], o) for o in outs[1:])
            err = max(((o.double() - exact).norm() / exact.norm()).item() for o in outs)
            times = [_form_us(x, weights, s, calls) for s in forms]
            best = min(times)
            splits = tc_cuda.choose_splits(-(-n // 128), -(-k // 128), sms)
            routed = tc_cuda.ring_stages(m)
            cells = " | ".join(f"{t:.1f}" for t in times)
            lines.append(
                f"| {n}x{k} | {m} | {splits} | {cells} | {moved / best / 1e3:.0f} | "
                f"{'registers' if routed == 0 else f'ring {routed}'} | "
                f"{err:.1e}{'' if same else ' (forms differ!)'} |"
            )
        del weights
        torch.cuda.empty_cache()
    return "\n".join(lines)


def _form_us(x: torch.Tensor, weights: Sequence[Fp8Weight], stages: int, calls: int) -> float:
    """µs per call of one form, each call on the next weight copy."""
    counter = itertools.count()
    return graph_us(
        lambda: tc_cuda.fp8_linear(x, weights[next(counter) % len(weights)], stages=stages),
        5,
        calls,
    )
