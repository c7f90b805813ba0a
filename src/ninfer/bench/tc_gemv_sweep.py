"""The tensor-core decode GEMVs on decode shapes, for `python -m ninfer.bench.kernel_bench
--fp8-shapes` (the fp8 kernel's two forms: weights in flight in registers, or in a cp.async ring
of 2-4 stages; which `launch_tc.RING_STAGES` should route) and `--bf16-tc-shapes` (the bf16 ring
kernel against the CUDA-core GEMV and cuBLAS: whether `bf16_tc_gemv.launch.tc_preferred` should
route a shape).

Weights come from DRAM as in a decode step: each captured call reads the next of enough weight
copies to span five times the H200's 50 MB L2.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from ninfer.artifact.quantize import quantize_fp8_block
from ninfer.bench.gpu_timing import (
    CALLS_PER_GRAPH,
    bf16_weight_copies,
    copies_for,
    graph_us,
    rotating,
)
from ninfer.kernels.bf16_gemv import launch as gemv_cuda
from ninfer.kernels.bf16_tc_gemv import launch as bf16_tc_cuda
from ninfer.kernels.fp8_gemm import launch as gemm_cuda
from ninfer.kernels.fp8_gemv import launch_tc as tc_cuda
from ninfer.kernels.fp8_gemv import reference as fp8_ref
from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from ninfer.kernels.fp8_gemv.tiles import attach_tiles, pack_tiles
from ninfer.kernels.fp8_split_gemv import launch as split_cuda

ROTATE_BYTES = 250 * 2**20
MAX_COPIES = 64
# 27B decode projections: gate-up, down, DeltaNet in_proj, out / o_proj, attention qkv
SHAPES = ((34816, 5120), (5120, 17408), (16480, 5120), (5120, 6144), (14336, 5120))
LM_HEAD = (248320, 5120)


def fp8_gemv_sweep(
    shapes: Sequence[tuple[int, int]], row_counts: Sequence[int], device: torch.device
) -> str:
    """Markdown table: µs per call of each form at its automatic split count, the best form's
    weight GB/s, what dispatch routes now, and the worst relative error against an fp64 product
    (all forms must agree bit for bit: the same mma in the same order). "tiles": the routed plan
    reading tile-major copies of the weights (`NINFER_KERNELS_ON=fp8_tiles`, tiles.py)."""
    forms = (0, *tc_cuda.STAGES)
    names = ["registers µs", *(f"ring {s} µs" for s in tc_cuda.STAGES)]
    names += [f"S={z} µs" for z in tc_cuda.SPLITS]  # the routed form at each k split count
    names += ["chunk 8 µs"]  # x staged 8 k blocks at a time, the ring that fits then
    names += ["tiles µs"]  # the routed plan over tile-major weights
    names += ["split-K CUDA cores µs"]  # fp8_split_gemv (1..MAX_ROWS rows; other sums)
    lines = [
        "fp8 tensor-core GEMV forms (bf16 x, e4m3 W [N, K] with 128x128 scales), graphs, cold L2;",
        "W8A8: prefill's path (x quantized per 1x128 group, then blockwise cuBLASLt _scaled_mm),",
        "not in the best column: it rounds x to e4m3",
        "| N x K | rows | splits | " + " | ".join(names) + " | best GB/s | routed | rel err | "
        "split-K rel err | W8A8 µs | W8A8 rel err |",
        "| --- | ---: | ---: | " + "---: | " * len(names) + "---: | --- |" + " ---: |" * 4,
    ]
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    for n, k in shapes:
        w = torch.randn(n, k, device=device) * k**-0.5
        weights = [Fp8Weight(*quantize_fp8_block(w))]
        del w
        moved = n * k
        copies = copies_for(moved, ROTATE_BYTES, MAX_COPIES)
        for _ in range(copies - 1):
            first = weights[0]
            weights.append(Fp8Weight(first.weight.clone(), first.scale_inv.clone()))
        calls = max(CALLS_PER_GRAPH, copies)
        tiled = [replace(w, tiles=pack_tiles(w.weight)) for w in weights]
        for m in row_counts:
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            exact = (
                x.double()
                @ fp8_ref.dequantize(weights[0].weight, weights[0].scale_inv, torch.float64).T
            )
            chunk8 = {"chunk": 8, "stages": tc_cuda.RING_STAGES[m]}
            outs = [tc_cuda.fp8_linear(x, weights[0], stages=s, chunk=16) for s in forms]
            outs.append(tc_cuda.fp8_linear(x, weights[0], **chunk8))
            outs.append(tc_cuda.fp8_linear(x, tiled[0]))
            same = all(torch.equal(outs[0], o) for o in outs[1:])
            err = max(((o.double() - exact).norm() / exact.norm()).item() for o in outs)
            plans = [{"stages": s, "chunk": 16} for s in forms]
            plans += [{"splits": z} for z in tc_cuda.SPLITS] + [chunk8]  # S=z: routed chunk
            times = [
                graph_us(rotating(lambda w, x=x, p=p: tc_cuda.fp8_linear(x, w, **p), weights),
                         5, calls)
                for p in plans
            ]  # fmt: skip
            times.append(graph_us(rotating(lambda w, x=x: tc_cuda.fp8_linear(x, w), tiled),
                                  5, calls))  # fmt: skip
            split_err = "—"
            if m <= split_cuda.MAX_ROWS:
                got = split_cuda.fp8_linear(x, weights[0])
                split_err = f"{((got.double() - exact).norm() / exact.norm()).item():.1e}"
                run = rotating(lambda w, x=x: split_cuda.fp8_linear(x, w), weights)
                times.append(graph_us(run, 5, calls))
            best = min(times)
            splits = tc_cuda.choose_splits(-(-n // 128), -(-k // 128), sms)
            routed = tc_cuda.ring_stages(m)
            cells = " | ".join(f"{t:.1f}" for t in times) + (" | —" if split_err == "—" else "")
            lines.append(
                f"| {n}x{k} | {m} | {splits} | {cells} | {moved / best / 1e3:.0f} | "
                f"{'registers' if routed == 0 else f'ring {routed}'} | "
                f"{err:.1e}{'' if same else ' (forms differ!)'} | {split_err} | "
                f"{_w8a8_cells(x, weights, exact, calls)} |"
            )
        del weights, tiled
        torch.cuda.empty_cache()
    return "\n".join(lines)


def _w8a8_cells(x: torch.Tensor, weights: list[Fp8Weight], exact: torch.Tensor, calls: int) -> str:
    """µs per call and error against the unquantized-x product of prefill's W8A8 path on the
    same rows, or why it does not run (the probe runs here, outside any capture)."""
    if gemm_cuda.choose_path(x, weights[0]) is not gemm_cuda.GemmPath.SCALED_MM:
        return "— | not on the grid or no blockwise _scaled_mm"
    got = gemm_cuda.fp8_gemm(x, weights[0])
    err = ((got.double() - exact).norm() / exact.norm()).item()
    us = graph_us(rotating(lambda w: gemm_cuda.fp8_gemm(x, w), weights), 5, calls)
    return f"{us:.1f} | {err:.1e}"


def bf16_tc_sweep(
    shapes: Sequence[tuple[int, int]], row_counts: Sequence[int], device: torch.device
) -> str:
    """Markdown table: µs per call of the CUDA-core bf16 GEMV, the tensor-core ring kernel at each
    depth (planned split count) and at each split count (default depth), `F.linear` (cuBLAS),
    the best kernel's weight GB/s, cuBLAS over the best tensor-core plan, and the worst relative
    error of the tensor-core plans against an fp64 product. "tiles": the planned ring reading
    tile-major copies (`NINFER_KERNELS_ON=bf16_tiles`, fp8_gemv/tiles.py), the same bits."""
    plans: list[dict] = [{"stages": s} for s in bf16_tc_cuda.STAGES]
    plans += [{"splits": z} for z in tc_cuda.SPLITS]  # the default ring at each k split count
    names = [f"tc ring {s} µs" for s in bf16_tc_cuda.STAGES]
    names += [f"S={z} µs" for z in tc_cuda.SPLITS]
    names += ["tiles µs"]
    lines = [
        "bf16 decode GEMVs (bf16 x, W [N, K]), graphs, cold L2",
        "| N x K | rows | gemv µs | " + " | ".join(names) + " | F.linear µs | best GB/s | "
        "F.linear / tc | rel err |",
        "| --- | ---: | ---: | " + "---: | " * len(names) + "---: | ---: | ---: | ---: |",
    ]
    for n, k in shapes:
        moved = 2 * n * k
        weights = bf16_weight_copies(n, k, device, rotate_bytes=ROTATE_BYTES, max_copies=MAX_COPIES)
        calls = max(CALLS_PER_GRAPH, len(weights))
        tiled = [w.clone() for w in weights]
        for w in tiled:
            attach_tiles(w)
        for m in row_counts:
            x = torch.randn(m, k, device=device).to(torch.bfloat16)
            exact = x.double() @ weights[0].double().T
            same = torch.equal(bf16_tc_cuda.bf16_linear(x, tiled[0]),
                               bf16_tc_cuda.bf16_linear(x, weights[0]))  # fmt: skip
            err = max(
                ((bf16_tc_cuda.bf16_linear(x, weights[0], **p).double() - exact).norm()
                 / exact.norm()).item()
                for p in plans
            )  # fmt: skip
            gemv = float("nan")
            if m <= gemv_cuda.MAX_ROWS and gemv_cuda.supports(x, weights[0]):
                gemv = graph_us(rotating(lambda w, x=x: gemv_cuda.bf16_linear(x, w), weights),
                                5, calls)  # fmt: skip
            ring = [
                graph_us(rotating(lambda w, x=x, p=p: bf16_tc_cuda.bf16_linear(x, w, **p), weights),
                         5, calls)
                for p in plans
            ]  # fmt: skip
            ring.append(graph_us(rotating(lambda w, x=x: bf16_tc_cuda.bf16_linear(x, w), tiled),
                                 5, calls))  # fmt: skip
            cublas = graph_us(
                rotating(lambda w, x=x: torch.nn.functional.linear(x, w), weights), 5, calls
            )
            best = min(t for t in (gemv, *ring, cublas) if t == t)
            cells = " | ".join(f"{t:.1f}" for t in ring)
            lines.append(
                f"| {n}x{k} | {m} | {gemv:.1f} | {cells} | {cublas:.1f} | "
                f"{moved / best / 1e3:.0f} | {cublas / min(ring):.2f} | "
                f"{err:.1e}{'' if same else ' (tiles differ!)'} |"
            )
        del weights, tiled
        torch.cuda.empty_cache()
    return "\n".join(lines)
