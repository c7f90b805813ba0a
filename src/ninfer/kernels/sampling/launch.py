"""CUDA launcher of the sampler: two launches per batch, no host sync, graph-capturable.

Imports torch and kernels.runtime (and the twin's RowParams). Same signature and token ids as
`reference.sample_tokens`. The row is split over several blocks when the batch alone would leave
most SMs idle (one 248k-column row is ~1 MB of logits), so a lone decode row is read at full-GPU
bandwidth; the split lists of 20 are merged by the one-warp draw kernel.
"""

from __future__ import annotations

import numpy as np
import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.sampling.reference import TOP_K_CAP, RowParams

OP = "sampling"
THREADS = 256  # sampling_topk's __launch_bounds__
MAX_SPLITS = 32  # SAMPLING_MAX_SPLITS in sampling.cu (the draw kernel's shared lists)
MIN_SPLIT_COLUMNS = 4096  # below this a block is mostly merge overhead
BLOCKS_PER_SM = 2
MAX_COLUMNS = (1 << 31) - 4096  # ids and column indices are int32 (2**31 - 1: no candidate)


def supports(logits: torch.Tensor, counts: torch.Tensor | None) -> bool:
    """True when the kernel takes these operands as they are (else the twin runs)."""
    ok = logits.dim() == 2 and logits.dtype in rt.CUDA_TYPES and logits.stride(-1) == 1
    ok = ok and logits.shape[1] <= MAX_COLUMNS and logits.shape[0] <= 65_535
    if counts is not None:
        ok = ok and counts.dtype == torch.int32 and counts.dim() == 2 and counts.stride(-1) == 1
    return ok


def num_splits_for(num_rows: int, num_sampleable: int, num_sms: int) -> int:
    """Blocks per row: enough to fill the GPU, each over at least MIN_SPLIT_COLUMNS columns."""
    by_width = -(-num_sampleable // MIN_SPLIT_COLUMNS)
    by_occupancy = -(-BLOCKS_PER_SM * num_sms // num_rows)
    return max(1, min(MAX_SPLITS, by_width, by_occupancy))


def sample_tokens(
    logits: torch.Tensor,
    rows: RowParams,
    *,
    num_sampleable: int,
    counts: torch.Tensor | None = None,
    count_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """See `reference.sample_tokens`."""
    device = rt.check_cuda(logits, rows.reals, rows.ints, counts, count_rows)
    if not supports(logits, counts):
        raise rt.KernelInputError(
            f"sampling takes 2-D float32/bfloat16 logits with unit column stride and int32 "
            f"counts, got logits {logits.dtype} {tuple(logits.shape)}"
        )
    num_rows = logits.shape[0]
    if not 1 <= num_sampleable <= logits.shape[1]:
        raise rt.KernelInputError(
            f"num_sampleable {num_sampleable} outside 1..{logits.shape[1]} logit columns"
        )
    reals, ints = rows.reals.contiguous(), rows.ints.contiguous()
    if reals.shape != (num_rows, 5) or reals.dtype != torch.float64:
        raise rt.KernelInputError(f"row reals must be [{num_rows}, 5] float64")
    if ints.shape != (num_rows, 4) or ints.dtype != torch.int64:
        raise rt.KernelInputError(f"row ints must be [{num_rows}, 4] int64")
    if counts is not None:
        if counts.shape[1] < num_sampleable:
            raise rt.KernelInputError(
                f"counts shape {tuple(counts.shape)} has fewer than {num_sampleable} columns"
            )
        if count_rows is not None:
            count_rows = count_rows.to(torch.int64).contiguous()
            if count_rows.shape != (num_rows,):
                raise rt.KernelInputError(f"count_rows must be [{num_rows}] row indices")
        elif counts.shape[0] != num_rows:
            raise rt.KernelInputError(f"counts has {counts.shape[0]} rows for {num_rows} logits")
    else:
        count_rows = None
    out = torch.empty(num_rows, dtype=torch.int64, device=device)
    if num_rows == 0:
        return out

    cand_z, cand_ids = _split_lists(logits, num_sampleable, device, counts, count_rows, reals)

    draw = rt.get_kernel(OP, "sampling_draw", device)
    draw_args = (
        rt.ptr(out),
        rt.ptr(cand_z),
        rt.ptr(cand_ids),
        rt.i32(cand_z.shape[1]),
        rt.i32(min(TOP_K_CAP, num_sampleable)),
        rt.ptr(reals),
        rt.ptr(ints),
    )
    rt.launch(draw, (num_rows,), (32,), draw_args, device)
    return out


def _split_lists(
    logits: torch.Tensor,
    num_sampleable: int,
    device: torch.device,
    counts: torch.Tensor | None = None,
    count_rows: torch.Tensor | None = None,
    reals: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """sampling_topk over each row's first num_sampleable columns: per split the 20 best
    (logit after the penalties, id), [rows, splits, 20] float32 and int32; without counts no
    penalties, and the row reals are not read."""
    num_rows = logits.shape[0]
    num_splits = num_splits_for(num_rows, num_sampleable, rt.num_sms(device))
    chunk = -(-num_sampleable // num_splits)
    num_splits = -(-num_sampleable // chunk)  # no empty trailing split
    cand_z = torch.empty((num_rows, num_splits, TOP_K_CAP), dtype=torch.float32, device=device)
    cand_ids = torch.empty((num_rows, num_splits, TOP_K_CAP), dtype=torch.int32, device=device)
    topk = rt.get_kernel(OP, f"sampling_topk<{rt.cuda_type(logits, 'logits')}>", device)
    topk_args = (
        rt.ptr(cand_z),
        rt.ptr(cand_ids),
        rt.ptr(logits),
        rt.i64(logits.stride(0)),
        rt.ptr(counts),
        rt.i64(0 if counts is None else counts.stride(0)),
        rt.ptr(count_rows),
        rt.ptr(reals),
        rt.i32(num_sampleable),
        rt.i32(chunk),
    )
    rt.launch(topk, (num_splits, num_rows), (THREADS,), topk_args, device)
    return cand_z, cand_ids


def supports_candidates(z: torch.Tensor, num_candidates: int) -> bool:
    """True when `top_candidates` takes these operands (else the twin runs)."""
    return (
        z.dim() == 2
        and z.dtype in rt.CUDA_TYPES
        and z.stride(-1) == 1
        and 1 <= num_candidates <= min(TOP_K_CAP, z.shape[1])
        and z.shape[1] <= MAX_COLUMNS
        and z.shape[0] <= 65_535
    )


def top_candidates(z: torch.Tensor, num_candidates: int) -> tuple[torch.Tensor, torch.Tensor]:
    """See `reference.top_candidates`: the sampler's split top-20 lists without penalties, then
    one warp per row merges them (two launches, where torch.topk's radix select takes two
    passes of a dozen kernels over the whole row)."""
    device = rt.check_cuda(z)
    if not supports_candidates(z, num_candidates):
        raise rt.KernelInputError(
            f"top candidates take 2-D float32/bfloat16 rows with unit column stride and 1..20 "
            f"candidates, got {z.dtype} {tuple(z.shape)} and {num_candidates}"
        )
    num_rows, num_columns = z.shape
    out_z = torch.empty((num_rows, num_candidates), dtype=torch.float32, device=device)
    out_ids = torch.empty((num_rows, num_candidates), dtype=torch.int64, device=device)
    if num_rows == 0:
        return out_ids, out_z
    # no counts: no penalties, and the row reals are not read
    cand_z, cand_ids = _split_lists(z, num_columns, device)
    merge = rt.get_kernel(OP, "sampling_candidates", device)
    merge_args = (
        rt.ptr(out_z),
        rt.ptr(out_ids),
        rt.ptr(cand_z),
        rt.ptr(cand_ids),
        rt.i32(cand_z.shape[1]),
        rt.i32(num_candidates),
    )
    rt.launch(merge, (num_rows,), (32,), merge_args, device)
    return out_ids, out_z


def counter_uniforms(
    seeds: torch.Tensor, steps: torch.Tensor, lanes: torch.Tensor, purpose: int
) -> torch.Tensor:
    """See `rng.counter_uniforms`: [B] seeds and steps (any element stride), [B, N] lane ids
    below 2**32 (unit column stride) -> [B, N] float64 uniforms, in one launch."""
    device = rt.check_cuda(seeds, steps, lanes)
    num_rows, num_lanes = lanes.shape
    if seeds.shape != (num_rows,) or steps.shape != (num_rows,):
        raise rt.KernelInputError(f"uniforms take [{num_rows}] seeds and steps")
    if lanes.stride(-1) != 1 and num_lanes > 1:
        lanes = lanes.contiguous()
    seeds, steps, lanes = (t.to(torch.int64) for t in (seeds, steps, lanes))
    out = torch.empty((num_rows, num_lanes), dtype=torch.float64, device=device)
    total = num_rows * num_lanes
    if total:
        kernel = rt.get_kernel(OP, "sampling_uniforms", device)
        args = (
            rt.ptr(out),
            rt.ptr(seeds),
            rt.i64(seeds.stride(0)),
            rt.ptr(steps),
            rt.i64(steps.stride(0)),
            rt.ptr(lanes),
            rt.i64(lanes.stride(0)),
            rt.i32(num_rows),
            rt.i32(num_lanes),
            np.uint32(int(purpose)),
        )
        rt.launch(kernel, (-(-total // 128),), (128,), args, device)
    return out


def philox4x32_10(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The kernel's Philox on [N, 4] counters and [N, 2] keys (uint32 words in int64): the
    speculative acceptance's counter RNG on CUDA (`dispatch.counter_uniforms`), and the tests.

    Returns [N, 4] int64 words, comparable with `rng.philox4x32_10`.
    """
    device = rt.check_cuda(counter, key)
    num = counter.shape[0]
    if counter.shape != (num, 4) or key.shape != (num, 2):
        raise rt.KernelInputError("philox takes [N, 4] counters and [N, 2] keys")
    c32 = counter.to(torch.int64).to(torch.int32).contiguous()  # low 32 bits, same bit pattern
    k32 = key.to(torch.int64).to(torch.int32).contiguous()
    out = torch.empty((num, 4), dtype=torch.int32, device=device)
    if num:
        kernel = rt.get_kernel(OP, "sampling_philox", device)
        args = (rt.ptr(out), rt.ptr(c32), rt.ptr(k32), rt.i32(num))
        rt.launch(kernel, (-(-num // 128),), (128,), args, device)
    return out.to(torch.int64) & 0xFFFFFFFF
