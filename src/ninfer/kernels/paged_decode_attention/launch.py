"""CUDA launcher of the split-KV paged decode attention (a partial and a combine launch).

Imports torch, kernels.runtime and the KV formats. Same results as
`reference.paged_decode_attention` where `supports` says yes. The split plan depends only on host
facts (batch, KV heads, group and the page table's width), never on the lengths on the device, so a
graph captured for one width replays for any lengths in it; the kernels read the lengths themselves
and skip splits past them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.kv_quant import formats as kvf
from ninfer.kernels.kv_quant.formats import KvPages, QuantPages
from ninfer.kernels.switches import switched_off

OP = "paged_decode_attention"
HEADERS = ("kv_quant/kv_codec.cu",)  # the KV codecs the kernel dequantizes with
# format codes of kv_codec.cu
FORMAT_CODES = {kvf.PLAIN: 0, kvf.INT8: 1, kvf.FP8: 2, kvf.NVFP4: 3}
WARPS = 4  # warps per block of the partial launch
MAX_REGS_PER_LANE = 64  # G query heads x D/32 dims of accumulator per lane (no spills at 64)
MAX_HEAD_DIM = 512  # a lane holds D/32 dims of each row it loads
MAX_GROUP = 16  # query heads per KV head (the reduce over SUB x G scores stays in registers)
MIN_SPLIT_TOKENS = 32  # one chunk of 8 tokens per warp
MAX_BLOCKS = 2048  # partial blocks over the table's capacity: ~15 per SM on an H200's 132
# The mma partial is fastest at about two blocks per SM (run T2 of docs/perf.md, 27B shape: 1k x
# 8 rows 22.3 µs at 288 blocks vs 30.5 at 1,088; 8k x 1 17.2 at 260 vs 28.0 at 1,032): its
# blocks are short, so larger splits spread the fixed cost (q, softmax, partial write, combine).
# They are counted over half the table's capacity: the decode graphs' tables are power-of-two
# page buckets (engine/graphs.py), so the longest row fills between half and all of its table.
# Counted over the whole table, a 32k row in its 64k bucket got 1,024-token splits: 132 live
# blocks, one per SM, where the sweep's best was ~260 (run T2: 8k x 1 row, 21.9 µs at 132 vs
# 17.2 at 260).
MMA_MAX_BLOCKS = 320
# Many rows at a few thousand tokens (35B-A3B, 64 rows at 2k: 128 (row, KV head) pairs) reach the
# block cap with 1,024-token splits, ~2 blocks per SM each walking its tokens one dependent tile
# at a time (run Y2, H100: 162 µs per layer for 268 MB of KV, 1.65 TB/s). From CAP_MIN_PAIRS
# pairs up no mma split is longer than MMA_MAX_SPLIT_TOKENS: run Y3 (H100) measured 64 rows 0.7 %
# (35B, 2k) and 0.4-1.0 % (27B, 1k) faster per step, 8 rows unchanged. Fewer pairs (the small
# batches the block cap was tuned on, run T2) keep their plans. `NINFER_KERNELS_OFF=
# paged_split_cap` turns it off. A 512-token cap from 128 pairs, the kernel sweep's best at 2k
# context once the V prefetch stopped there (run Z8, H100: 35B heads x 64 rows 116.2 -> 110.1 µs
# per call), was not faster in the model step (run Z9: 35B-A3B batch 64 29.37 / 29.33 ms against
# 29.08 with 256), so 256 stays.
MMA_MAX_SPLIT_TOKENS = 256
CAP_MIN_PAIRS = 64

# The mma partial prefetches each scored tile's V rows into L2 for phase 3. From
# PREFETCH_MAX_PAIRS (row, KV head) pairs up it does not: with hundreds of blocks in flight the
# prefetched V outgrows the L2 before phase 3 reads it and is fetched twice (run Z3, H100, 64 rows
# at 2k: 35B-A3B heads 149.9 -> 116.6 µs per call, 27B heads 268.6 -> 207.1), and at 32 pairs
# too (run Z8: 35B heads x 16 rows 47.6 -> 43.7, 27B heads x 8 rows 43.8 -> 41.1; in the model
# step within the drift, run Z9); at 16 pairs it is even (35B x 8 rows 27.2 / 26.7).
# `NINFER_KERNELS_OFF=paged_prefetch_rule` prefetches at every batch, `paged_v_prefetch` at none.
PREFETCH_MAX_PAIRS = 32

# Token tiles (phase 1) and k-steps (phase 3) whose loads a warp issues together: 1 ran in run
# T2; 2 doubles the bytes in flight at ~2 blocks per SM (bit-equal results; in a 27B step within
# the run's drift, run Y1 on an H100: `NINFER_KERNELS_ON=paged_mma_tiles2` selects it).
MMA_TILES = 1
SCORE_FLOATS = 8192  # shared-memory scores per block (32 KiB): G x tokens_per_split
COMBINE_DIMS = 32  # head dims per combine block
# Plans of at most this many splits combine one warp per (sequence, query head)
# (`paged_decode_combine_warp`, the same bits) instead of D / 32 blocks of 256 threads each;
# `NINFER_KERNELS_OFF=paged_combine_warp` keeps the block form.
WARP_COMBINE_MAX_SPLITS = 32


class SplitPlan(NamedTuple):
    """How the KV positions of the page table's capacity are cut into partial blocks."""

    tokens_per_split: int
    num_splits: int


def _pages_ok(q: torch.Tensor, pages: KvPages, head_dim: int) -> bool:
    """One K or V operand: plain pages in q's dtype, or quantized pages the codecs take."""
    if not isinstance(pages, QuantPages):
        return pages.dtype == q.dtype and pages.data_ptr() % 16 == 0
    if pages.fmt == kvf.NVFP4 and 16 % (head_dim // 32):
        return False  # a lane's dims must sit inside one 16-value block
    return pages.values.data_ptr() % 16 == 0


def supports(q: torch.Tensor, k_pages: KvPages, v_pages: KvPages | None = None) -> bool:
    """Whether the kernel takes these shapes (head dim a multiple of 32 to 512, modest groups)
    and KV formats (plain pages in q's dtype, int8, fp8, or nvfp4 with head dim 32..512 a power
    of two)."""
    if q.dim() != 3 or len(k_pages.shape) != 4 or q.dtype not in rt.CUDA_TYPES:
        return False
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_pages.shape[2]
    if num_kv_heads == 0 or num_q_heads % num_kv_heads:
        return False
    group = num_q_heads // num_kv_heads
    shape_ok = (
        k_pages.shape[3] == head_dim
        and head_dim % 32 == 0
        and 32 <= head_dim <= MAX_HEAD_DIM
        and group <= MAX_GROUP
        and group * (head_dim // 32) <= MAX_REGS_PER_LANE
    )
    if not shape_ok or not _pages_ok(q, k_pages, head_dim):
        return False
    return v_pages is None or (
        tuple(v_pages.shape) == tuple(k_pages.shape) and _pages_ok(q, v_pages, head_dim)
    )


def _operand(pages: KvPages) -> tuple[int, tuple]:
    """(format code, (values, row scales, block scales) kernel pointers) of one K or V operand."""
    if not isinstance(pages, QuantPages):
        if not pages.is_contiguous():
            raise rt.KernelInputError("KV pages must be contiguous")
        return 0, (rt.ptr(pages), rt.ptr(None), rt.ptr(None))
    if not all(t.is_contiguous() for t in pages.tensors()):
        raise rt.KernelInputError("quantized KV pages and scales must be contiguous")
    code = FORMAT_CODES[pages.fmt]
    return code, (rt.ptr(pages.values), rt.ptr(pages.scale), rt.ptr(pages.block_scale))


# plain, int8 and fp8 codes: exact as mma operands (bf16 / f16)
MMA_FORMATS = tuple(FORMAT_CODES[f] for f in (kvf.PLAIN, kvf.INT8, kvf.FP8))
MMA_MAX_GROUP = 8  # the heads are the mma's M rows (16, of which G live)


def uses_tensor_cores(q: torch.Tensor, group: int, k_code: int, v_code: int) -> bool:
    """Whether `paged_decode_mma` serves these operands: a bf16 model, K and V in one format of
    MMA_FORMATS, G <= 8 and D a multiple of 64 (of 128 for 8-bit codes: a lane's 4 dims per token
    must fill a 32-bit load)."""
    head_dim = q.shape[2]
    return (
        q.dtype == torch.bfloat16
        and group <= MMA_MAX_GROUP
        and k_code == v_code
        and k_code in MMA_FORMATS
        and head_dim % (64 if k_code == FORMAT_CODES[kvf.PLAIN] else 128) == 0
    )


def plan_splits(
    num_seqs: int,
    num_kv_heads: int,
    group: int,
    capacity: int,
    max_blocks: int = MAX_BLOCKS,
    live: int | None = None,
) -> SplitPlan:
    """Tokens per split: the smallest power of two >= 32 that keeps the partial blocks over `live`
    tokens (default: the table's capacity) within `max_blocks`; the splits cover the capacity.

    Small splits keep short contexts spread over the SMs (1k tokens, batch 1, 4 KV heads: 32
    splits of 32 tokens = 128 blocks); long ones grow the split so the combine stays cheap (a 32k
    table: 256 splits of 128). Bounded by the block's shared memory for G x split scores.
    """
    max_tokens = MIN_SPLIT_TOKENS
    while max_tokens * 2 * group <= SCORE_FLOATS:
        max_tokens *= 2
    capacity = max(capacity, 1)
    counted = max(capacity if live is None else live, 1)
    size = MIN_SPLIT_TOKENS
    while size < max_tokens and num_seqs * num_kv_heads * -(-counted // size) > max_blocks:
        size *= 2
    return SplitPlan(size, -(-capacity // size))


def mma_plan(num_seqs: int, num_kv_heads: int, group: int, capacity: int) -> SplitPlan:
    """The tensor-core partial's plan: `plan_splits` with its own block cap, counted over half
    the table (graph tables are power-of-two page buckets the longest row fills between half
    and all of), then from CAP_MIN_PAIRS (row, KV head) pairs splits of at most
    MMA_MAX_SPLIT_TOKENS (unless `paged_split_cap` is in NINFER_KERNELS_OFF)."""
    plan = plan_splits(num_seqs, num_kv_heads, group, capacity, MMA_MAX_BLOCKS, capacity // 2)
    if num_seqs * num_kv_heads >= CAP_MIN_PAIRS and not switched_off("paged_split_cap"):
        plan = cap_split(plan, capacity, MMA_MAX_SPLIT_TOKENS)
    return plan


def cap_split(plan: SplitPlan, capacity: int, max_tokens: int) -> SplitPlan:
    """`plan` with splits of at most `max_tokens` (a power of two >= MIN_SPLIT_TOKENS) covering
    the same capacity; a plan already within it is returned as is."""
    if plan.tokens_per_split <= max_tokens:
        return plan
    return SplitPlan(max_tokens, -(-max(capacity, 1) // max_tokens))


def prefetches_v(num_seqs: int, num_kv_heads: int) -> bool:
    """Whether the mma partial prefetches V into L2: below PREFETCH_MAX_PAIRS (row, KV head)
    pairs (or always, with `paged_prefetch_rule` in NINFER_KERNELS_OFF); never with
    `paged_v_prefetch` there."""
    if switched_off("paged_v_prefetch"):
        return False
    return num_seqs * num_kv_heads < PREFETCH_MAX_PAIRS or switched_off("paged_prefetch_rule")


def uses_warp_combine(num_splits: int, head_dim: int) -> bool:
    """Whether a plan of `num_splits` combines one warp per (sequence, query head): at most
    WARP_COMBINE_MAX_SPLITS splits (one per lane, added in split order, as the block form does
    then), whole float4s per lane (D a multiple of 128), unless switched off."""
    return (
        num_splits <= WARP_COMBINE_MAX_SPLITS
        and head_dim % 128 == 0
        and not switched_off("paged_combine_warp")
    )


def partial_smem_bytes(group: int, head_dim: int, tokens_per_split: int) -> int:
    """The partial block's dynamic shared memory: the scores, later the warps' accumulators."""
    return 4 * max(group * tokens_per_split, WARPS * group * head_dim)


def paged_decode_attention(
    q: torch.Tensor,
    k_pages: KvPages,
    v_pages: KvPages,
    page_table: torch.Tensor,
    kv_lens: torch.Tensor,
    *,
    scale: float,
    tokens_per_split: int | None = None,
    tensor_cores: bool = True,
    mma_tiles: int = MMA_TILES,
    prefetch_v: bool | None = None,
    warp_combine: bool = True,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """See `reference.paged_decode_attention`. `tokens_per_split` (a power of two >= 32 within
    the block's score memory) overrides `plan_splits` for benchmark sweeps; `tensor_cores`
    False keeps the CUDA-core partial kernel where the mma one would serve; `mma_tiles` (1 or 2)
    sets the mma kernel's tiles per warp iteration, `prefetch_v` whether it prefetches V into
    L2 while it scores (None: `prefetches_v`); `warp_combine` False keeps the block combine
    where the warp one would serve (`uses_warp_combine`). None of these three changes the
    bits. With a `gate` (bf16 [B, Hq, D], rows and heads at any stride, dims dense: the gated
    attention's gate slice of its q projection) the combine writes `o * sigmoid(gate)`, the bits
    of `sigmoid_gate` applied to the ungated result (see `gate_problem`)."""
    k_tensors, v_tensors = kvf.page_tensors(k_pages), kvf.page_tensors(v_pages)
    device = rt.check_cuda(q, *k_tensors, *v_tensors, page_table, kv_lens)
    if not supports(q, k_pages, v_pages):
        raise rt.KernelInputError(
            f"paged decode attention does not take q {tuple(q.shape)} {q.dtype} with pages "
            f"{_describe(k_pages)} / {_describe(v_pages)}"
        )
    k_code, k_args = _operand(k_pages)
    v_code, v_args = _operand(v_pages)
    num_seqs, num_q_heads, head_dim = q.shape
    if gate is not None and (problem := gate_problem(q, gate)) is not None:
        raise rt.KernelInputError(f"paged decode attention's output gate: {problem}")
    page_size, num_kv_heads = k_pages.shape[1], k_pages.shape[2]
    group = num_q_heads // num_kv_heads
    q = q.contiguous()
    if q.data_ptr() % 16:
        q = q.clone()  # the kernel loads q rows as 16-byte vectors
    # the graphs pass the table as a column slice of a wider buffer: read it with its row stride
    table = page_table if page_table.dtype == torch.int64 else page_table.to(torch.int64)
    if table.dim() != 2 or table.shape[0] != num_seqs:
        raise rt.KernelInputError(f"page table {tuple(table.shape)} is not [{num_seqs}, width]")
    if table.stride(1) != 1:
        table = table.contiguous()
    lens = kv_lens.to(torch.int64).contiguous()
    out = torch.empty_like(q)
    if num_seqs == 0:
        return out
    table_width = table.shape[1]
    mma = tensor_cores and uses_tensor_cores(q, group, k_code, v_code)
    capacity = table_width * page_size
    if mma:
        plan = mma_plan(num_seqs, num_kv_heads, group, capacity)
    else:
        plan = plan_splits(num_seqs, num_kv_heads, group, capacity)
    if tokens_per_split is not None:
        if (
            tokens_per_split < MIN_SPLIT_TOKENS
            or tokens_per_split & (tokens_per_split - 1)
            or tokens_per_split * group > SCORE_FLOATS
        ):
            raise rt.KernelInputError(f"tokens_per_split {tokens_per_split} is not a usable split")
        plan = SplitPlan(tokens_per_split, -(-capacity // tokens_per_split))
    ws_acc = torch.empty(
        (num_seqs, num_q_heads, plan.num_splits, head_dim), dtype=torch.float32, device=device
    )
    ws_ml = torch.empty(
        (num_seqs, num_q_heads, plan.num_splits, 2), dtype=torch.float32, device=device
    )
    dtype = rt.cuda_type(q, "q")
    if mma:
        if mma_tiles not in (1, 2):
            raise rt.KernelInputError(f"mma_tiles must be 1 or 2, got {mma_tiles}")
        if prefetch_v is None:
            prefetch_v = prefetches_v(num_seqs, num_kv_heads)
        pfv = "true" if prefetch_v else "false"
        instance = f"paged_decode_mma<{head_dim}, {group}, {k_code}, {mma_tiles}, {pfv}>"
        smem = 4 * group * plan.tokens_per_split
    else:
        instance = f"paged_decode_partial<{dtype}, {head_dim}, {group}, {k_code}, {v_code}>"
        smem = partial_smem_bytes(group, head_dim, plan.tokens_per_split)
    partial = rt.get_kernel(OP, instance, device, HEADERS)
    args = (
        rt.ptr(ws_acc),
        rt.ptr(ws_ml),
        rt.ptr(q),
        *k_args,
        *v_args,
        rt.ptr(table),
        rt.i64(table.stride(0)),
        rt.ptr(lens),
        rt.i32(num_kv_heads),
        rt.i32(page_size),
        rt.i32(table_width),
        rt.i32(plan.num_splits),
        rt.i32(plan.tokens_per_split),
        rt.f32(scale),
    )
    grid = (plan.num_splits, num_kv_heads, num_seqs)
    rt.launch(partial, grid, (32 * WARPS,), args, device, shared_mem=smem)
    common = (
        rt.i32(plan.num_splits),
        rt.i32(plan.tokens_per_split),
        rt.i32(table_width),
        rt.i32(page_size),
    )
    rows = num_seqs * num_q_heads
    gating = (
        rt.ptr(gate),
        rt.i64(gate.stride(0) if gate is not None else 0),
        rt.i64(gate.stride(1) if gate is not None else 0),
    )
    if warp_combine and uses_warp_combine(plan.num_splits, head_dim):
        instance = f"paged_decode_combine_warp<{dtype}, {head_dim}>"
        combine = rt.get_kernel(OP, instance, device, HEADERS)
        args = (rt.ptr(out), rt.ptr(ws_acc), rt.ptr(ws_ml), rt.ptr(lens), rt.i64(rows))
        args += (rt.i32(num_q_heads), *common, *gating)
        grid = (-(-rows // 8), 1, 1)
    else:
        combine = rt.get_kernel(OP, f"paged_decode_combine<{dtype}>", device, HEADERS)
        args = (rt.ptr(out), rt.ptr(ws_acc), rt.ptr(ws_ml), rt.ptr(lens), *common)
        args += (rt.i32(head_dim), *gating)
        grid = (num_q_heads, num_seqs, head_dim // COMBINE_DIMS)
    rt.launch(combine, grid, (256,), args, device)
    return out


def gate_problem(q: torch.Tensor, gate: torch.Tensor) -> str | None:
    """Why the combine cannot apply this output gate to q's attention, or None when it can."""
    if q.dtype != torch.bfloat16 or gate.dtype != torch.bfloat16:
        return f"the gated combine is bf16 only, got q {q.dtype} and gate {gate.dtype}"
    if gate.shape != q.shape:
        return f"gate {tuple(gate.shape)} does not match q {tuple(q.shape)}"
    if gate.device != q.device or gate.stride(2) != 1:
        return "gate must be on q's device with dense head dims"
    return None


def _describe(pages: KvPages) -> str:
    if isinstance(pages, QuantPages):
        return f"{pages.fmt} {tuple(pages.shape)}"
    return f"{tuple(pages.shape)} {pages.dtype}"
