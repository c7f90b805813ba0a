"""CUDA launcher of the tensor-core fp8 GEMV (`fp8_tc_gemv` in fp8_gemv.cu), what decode runs.

Imports torch and kernels.runtime. Same signature and results as `reference.fp8_linear` where
`supports` says yes: 1..MAX_ROWS bf16 x rows, K a multiple of 16, dense 16-byte-aligned operands,
an sm_90+ GPU (thread-block clusters). x is bf16 only: the tensor cores multiply f16, which holds
bf16 exactly after the kernel's per-block power-of-two scaling but would round fp32 x (a tiny
fp32 model drifted to 3e-3 row errors on the H200), so fp32 x runs the CUDA-core GEMV. The grid
is one 128-row block per k split; the splits of a row block form one thread-block cluster
(`choose_splits` says how many: at least a resident wave's worth, more while the splits stay
long enough, measured in runs X1-X2 of docs/perf.md).

Two forms of the same kernel: `fp8_tc_gemv` keeps one k block of weights in flight per thread in
registers; `fp8_tc_gemv_ring` keeps STAGES - 1 in flight through a cp.async ring in shared memory
(and issues the first ones before waiting on the previous kernel). Same sums, same bits.
`ring_stages` says which runs for a row count (0: the register form).

The ring form also takes a dense MLP's [gate | up] rows (`swiglu_input`; dispatch routes it for
1..SWIGLU_MAX_ROWS rows, docs/perf.md S46E): it stages swiglu(gate, up) as x, rounded as
`silu_mul` writes it, so the down projection needs no `silu_mul` launch and gives its very bits.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.fp8_gemv.reference import BLOCK, Fp8Weight
from ninfer.kernels.fp8_gemv.tiles import tiles_mismatch
from ninfer.kernels.switches import switched_off, switched_on

OP = "fp8_gemv"  # the source file: fp8_gemv.cu holds both GEMV kernels
HEADERS = ("fp8_gemv/tc_common.cu",)  # the cluster reduction and the cp.async ring
THREADS = 256  # 8 warps x 16 rows: one 128-row scale block per thread block
BLOCKS_PER_SM = 3  # __launch_bounds__(256, 3) in fp8_gemv.cu: <= 80 registers
MAX_ROWS = 8  # x rows per launch: the mma's n = 8
SPLITS = (1, 2, 4, 8)  # k splits per row block = cluster sizes compiled (portable limit 8)
MIN_SPLIT_K_BLOCKS = 6  # choose_splits: k blocks per split below which more splits stop paying
STAGES = (2, 3, 4)  # ring depths compiled (k blocks of 16 KiB each per block)
SHARED_PER_SM = 228 * 1024  # shared memory per SM on sm_90
RESERVED_PER_BLOCK = 1024  # what the driver keeps of it for each resident block
CHUNK = 16  # the .cu's kChunk: k blocks of x staged at a time
FIT_CHUNK_MAX = 40  # the .cu's kRingChunkMax: the most k blocks a ring form stages at once
# From CHUNK8_MIN_ROWS x rows the ring form stages x 8 k blocks at a time: half the staged rows
# leave room for a ring a stage deeper at the same 3 blocks per SM (the MTP verify's 4 rows run
# 4 stages, 8 rows 3), at two barriers and an x round trip twice as often. Run S43C (H100): the
# 27B fp8 step at 8 rows 0.979x, 4 rows 1.002x, the MTP round 0.99x; same bits.
# `NINFER_KERNELS_OFF=fp8_chunk8` stages 16 at every row count (RING_STAGES_FULL_CHUNK).
CHUNK8_MIN_ROWS = 3
# The ring's depth by x rows (0: the register form), the deepest that keeps 3 blocks per SM with
# the routed chunk. Run X1 (H200, docs/perf.md): the 27B fp8 step at batch 8 12.52 ms against
# 13.19 with the register form, batch 1 9.95 against 10.05 (16-block chunks then).
RING_STAGES = {1: 4, 2: 4, 3: 4, 4: 4, 5: 4, 6: 3, 7: 3, 8: 3}
RING_STAGES_FULL_CHUNK = {1: 4, 2: 4, 3: 3, 4: 3, 5: 2, 6: 2, 7: 2, 8: 2}


class Fp8TcError(rt.KernelInputError):
    """Operands the tensor-core fp8 GEMV does not take (check `supports` first)."""


def supports(x: torch.Tensor, weight: Fp8Weight) -> bool:
    """Whether the kernel takes these operands (otherwise the older kernel or the twin runs)."""
    w, s = weight.weight, weight.scale_inv
    if x.dim() != 2 or x.dtype != torch.bfloat16 or w.dtype != torch.float8_e4m3fn:
        return False
    if w.dim() != 2 or not x.is_cuda:
        return False
    n, k = w.shape
    return (
        s.dtype == torch.float32
        and s.is_contiguous()
        and tuple(s.shape) == (-(-n // BLOCK), -(-k // BLOCK))
        and tc_operands_ok(x, w, k_multiple=16)
    )


def supports_swiglu(x: torch.Tensor, weight: Fp8Weight) -> bool:
    """Whether the ring form takes x as [gate | up] rows of width 2K for this weight [N, K]: as
    `supports` for the activated x (bf16, 1..MAX_ROWS dense 16-byte-aligned rows, K % 16 == 0,
    sm_90+), the row twice as wide."""
    if x.dim() != 2 or x.dtype != torch.bfloat16 or not x.is_cuda:
        return False
    if weight.weight.dim() != 2 or x.shape[1] != 2 * weight.shape[1]:
        return False
    return supports(x[:, : weight.shape[1]], weight)


# The shortest rows `NINFER_KERNELS_ON=long_k_tiles` tiles: the 27B's down (17,408) and out_proj /
# o_proj (6,144), where tiles gained the most per shape (S47B, H100: 0.90-0.98x), not its K =
# 5,120 projections (even alone; twice the bytes). `qwen3_5._tiled` binds by the same rule.
LONG_K_TILES = 6144


def tiles_wanted(k: int) -> bool:
    """Whether an fp8 weight with rows of K = `k` is tiled and its tiles read: every K, or with
    `NINFER_KERNELS_ON=long_k_tiles` K >= LONG_K_TILES only (binding and launch ask alike)."""
    return k >= LONG_K_TILES or not switched_on("long_k_tiles")


SWIGLU_MAX_ROWS = 4  # the SwiGLU input form's rows by default (S46E, H100: the fp8 MTP round
# 0.995x, its 4-row verify 0.99x, the 1- and 4-row steps 0.997x; 8 rows 1.011x, so not there)


def swiglu_routed(x: torch.Tensor, weight: Fp8Weight) -> bool:
    """Whether dispatch runs the down projection of [gate | up] rows through the ring form's
    SwiGLU input: 1..SWIGLU_MAX_ROWS rows (every row count with `NINFER_KERNELS_ON=fp8_swiglu`,
    none with `NINFER_KERNELS_OFF=fp8_swiglu`: A/B runs), the ring form routed for the row count
    (not `fp8_ring` or `fp8_tc` off) and operands it takes."""
    return (
        (x.shape[0] <= SWIGLU_MAX_ROWS or switched_on("fp8_swiglu"))
        and not switched_off("fp8_swiglu")
        and not switched_off("fp8_tc")
        and supports_swiglu(x, weight)  # 2-D, 1..MAX_ROWS rows: ring_stages may index by them
        and ring_stages(x.shape[0]) != 0
    )


def tc_operands_ok(x: torch.Tensor, w: torch.Tensor, *, k_multiple: int) -> bool:
    """The rules both tensor-core GEMVs (this one and `bf16_tc_gemv`) share for 2-D CUDA x and a
    2-D weight of their dtypes: 1..MAX_ROWS x rows of the weight's row length K, a multiple of
    `k_multiple`, dense 16-byte-aligned x rows, a contiguous 16-byte-aligned weight, an sm_90+
    GPU (clusters; asked last, the one device query)."""
    n, k = w.shape
    return (
        1 <= x.shape[0] <= MAX_ROWS
        and n >= 1
        and x.shape[1] == k
        and k >= k_multiple
        and k % k_multiple == 0
        and x.stride(1) == 1
        and (x.stride(0) * x.element_size()) % 16 == 0
        and x.data_ptr() % 16 == 0
        and w.is_contiguous()
        and w.data_ptr() % 16 == 0
        and torch.cuda.get_device_capability(x.device) >= (9, 0)
    )


def choose_splits(num_row_blocks: int, num_k_blocks: int, num_sms: int) -> int:
    """The k split count (1, 2, 4 or 8, at most the k blocks) of a row block.

    The larger of two rules: the most splits whose grid fits one resident wave (more blocks, more
    loads in flight, no queued second wave), and the most that still leave every split
    MIN_SPLIT_K_BLOCKS k blocks (128 bytes of each row). The second gives the wide K = 5,120
    projections several waves of short blocks instead of one wave of long ones: run X2 measured
    the fp8 gate-up 34,816 x 5,120 at 61.0 µs with 4 splits against 66.1 with one-wave's 1, the
    in_proj 16,480 x 5,120 at 31.9 against 35.1 (H100). `NINFER_KERNELS_OFF=tc_wide_grid` keeps
    the one-wave rule alone (the A/B's other side).
    """
    capacity = BLOCKS_PER_SM * num_sms
    one_wave = 1
    for splits in SPLITS:
        if splits <= num_k_blocks and num_row_blocks * splits <= capacity:
            one_wave = splits
    if switched_off("tc_wide_grid"):
        return one_wave
    short = 1
    for splits in SPLITS:
        if num_k_blocks // splits >= MIN_SPLIT_K_BLOCKS:
            short = splits
    return max(one_wave, short)


def ring_shared_bytes(num_rows: int, stages: int, chunk: int = CHUNK) -> int:
    """Dynamic shared memory of the ring form: the ring, the staged x rows (`chunk` k blocks of
    f16 and 16 bytes of padding each) and their chunk's scales."""
    return stages * 16 * 1024 + num_rows * 2 * (chunk * 128 + 8) + chunk * 8 * 4


def fit_chunk(num_rows: int, stages: int, split_k_blocks: int, blocks_per_sm: int) -> int:
    """The k blocks of x to stage at a time so that a split of `split_k_blocks` k blocks stages
    as few times as `blocks_per_sm` ring forms of depth `stages` an SM allow (each staging is an
    x round trip between two barriers with no new weight copies issued), the chunks as even as
    that count makes them; 0 where not even one k block fits beside the ring."""
    budget = SHARED_PER_SM // blocks_per_sm - RESERVED_PER_BLOCK
    most = 0
    for chunk in range(1, FIT_CHUNK_MAX + 1):
        if ring_shared_bytes(num_rows, stages, chunk) <= budget:
            most = chunk
    if most == 0 or split_k_blocks < 1:
        return most
    stagings = -(-split_k_blocks // most)
    return -(-split_k_blocks // stagings)


def ring_plan(
    num_rows: int, num_row_blocks: int, num_k_blocks: int, splits: int, num_sms: int
) -> tuple[int, int]:
    """(ring depth, staged chunk) dispatch runs for this launch; depth 0 is the register form.

    The default is `ring_stages` and `ring_chunk` by row count alone. Two opt-in refinements
    look at the split's length and the grid:
    - `NINFER_KERNELS_ON=fp8_fit_chunk` stages each split's x in one go where it fits beside
      the routed ring at 3 blocks an SM (`fit_chunk`): the 8-block chunks from 3 rows stage a
      K = 5,120 split (10 k blocks) twice, stalling its weight stream once mid-loop.
    - `NINFER_KERNELS_ON=fp8_four_per_sm` gives a grid of 3-4 blocks an SM (the 27B's qkv and
      in_proj at 4 splits: 448 and 516 blocks on 132 SMs) a ring shallow enough for 4 blocks an
      SM, so it runs in one wave instead of a full one and a seventh of another: the deepest
      whose `fit_chunk` stages the split once, else the deepest that fits (H200 sweep S45D: qkv
      at 1 row 21.1 µs with 3 stages against 22.3 with 4, at 4 rows 22.6 with 2 against 24.0).
    The staged values and the mma order do not depend on either: the same bits.
    """
    stages, chunk = ring_stages(num_rows), ring_chunk(num_rows)
    if stages == 0:
        return stages, chunk
    split_k_blocks = -(-num_k_blocks // splits)
    grid = num_row_blocks * splits
    if switched_on("fp8_four_per_sm") and BLOCKS_PER_SM * num_sms < grid <= 4 * num_sms:
        chunks = [(s, fit_chunk(num_rows, s, split_k_blocks, 4)) for s in sorted(STAGES)]
        fitting = [(s, c) for s, c in chunks if c > 0]
        if fitting:
            whole = [(s, c) for s, c in fitting if c >= split_k_blocks]
            return (whole or fitting)[-1]
    if switched_on("fp8_fit_chunk"):
        fitted = fit_chunk(num_rows, stages, split_k_blocks, BLOCKS_PER_SM)
        if fitted > 0:
            return stages, fitted
    return stages, chunk


def ring_chunk(num_rows: int) -> int:
    """The k blocks of x the ring form stages at a time for `num_rows` x rows: 8 from
    CHUNK8_MIN_ROWS rows (unless `fp8_chunk8` is switched off), else CHUNK."""
    if num_rows >= CHUNK8_MIN_ROWS and not switched_off("fp8_chunk8"):
        return 8
    return CHUNK


def ring_stages(num_rows: int) -> int:
    """The ring depth dispatch runs for `num_rows` x rows (with `ring_chunk`'s staging); 0 runs
    the register form (`NINFER_KERNELS_OFF=fp8_ring` too)."""
    if switched_off("fp8_ring"):
        return 0
    if ring_chunk(num_rows) == CHUNK:
        return RING_STAGES_FULL_CHUNK[num_rows]
    return RING_STAGES[num_rows]


def fp8_linear(
    x: torch.Tensor,
    weight: Fp8Weight,
    *,
    splits: int | None = None,
    stages: int | None = None,
    swiglu_input: bool = False,
    chunk: int | None = None,
) -> torch.Tensor:
    """See `reference.fp8_linear`; `splits` overrides the k split count (1, 2, 4 or 8),
    `stages` the form (0: registers, else a ring depth in STAGES) and `chunk` the ring form's
    staged k blocks (1..FIT_CHUNK_MAX; without either, `ring_plan` picks both; with `stages`
    alone, `ring_chunk`): tests and kernel_bench.
    `swiglu_input`: x is [gate | up] rows of width 2K and the product is swiglu(x) @ W.T
    (`silu_mul` then this, bit for bit; the ring form only)."""
    device = rt.check_cuda(x, weight.weight, weight.scale_inv)
    if swiglu_input:
        if not supports_swiglu(x, weight):
            raise Fp8TcError(
                f"the SwiGLU input form needs 1..{MAX_ROWS} dense 16-byte-aligned bf16 [gate | "
                f"up] rows twice the weight's K, K % 16 == 0, and an sm_90+ GPU; got x "
                f"{tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)}"
            )
    elif not supports(x, weight):
        raise Fp8TcError(
            f"tensor-core fp8 GEMV needs 1..{MAX_ROWS} dense 16-byte-aligned bf16 x rows, "
            f"K % 16 == 0, "
            f"contiguous e4m3 weights with f32 [ceil(N/128), ceil(K/128)] scales and an sm_90+ "
            f"GPU; got x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} "
            f"{weight.weight.dtype}"
        )
    n, k = weight.shape
    num_rows = x.shape[0]
    num_row_blocks, num_k_blocks = weight.scale_inv.shape
    if splits is None:
        splits = choose_splits(num_row_blocks, num_k_blocks, rt.num_sms(device))
    elif splits not in SPLITS:
        raise Fp8TcError(f"k splits must be one of {SPLITS}, got {splits}")
    if stages is None and chunk is None:
        stages, chunk = ring_plan(
            num_rows, num_row_blocks, num_k_blocks, splits, rt.num_sms(device)
        )
    if stages is None:
        stages = ring_stages(num_rows)
    elif stages != 0 and stages not in STAGES:
        raise Fp8TcError(f"ring stages must be 0 (registers) or one of {STAGES}, got {stages}")
    if swiglu_input and stages == 0:
        raise Fp8TcError("the SwiGLU input form runs in the ring form only (stages > 0)")
    if chunk is None:
        chunk = ring_chunk(num_rows)
    elif not 1 <= chunk <= FIT_CHUNK_MAX:
        raise Fp8TcError(f"staged x chunks must be 1..{FIT_CHUNK_MAX} k blocks, got {chunk}")
    # tiles bound (`NINFER_KERNELS_ON=fp8_tiles` at load) are read unless switched off at launch
    # or `tiles_wanted` says no: one process can time each side (`--ab`)
    packed = stages != 0 and weight.tiles is not None and not switched_off("fp8_tiles")
    packed = packed and tiles_wanted(k)
    if packed and (why := tiles_mismatch(weight.tiles, n, k)):
        raise Fp8TcError(why)
    out = torch.empty((num_rows, n), dtype=x.dtype, device=device)
    t = rt.cuda_type(x, "x")
    shared = 0
    if stages == 0:
        instance = f"fp8_tc_gemv<{t}, {num_rows}, {splits}>"
    else:
        form = 1 if swiglu_input else 0  # the .cu's kInputSwiglu / kInputPlain
        instance = (
            f"fp8_tc_gemv_ring<{t}, {num_rows}, {splits}, {stages}, {form}, {chunk}, "
            f"{'true' if packed else 'false'}>"
        )
        shared = ring_shared_bytes(num_rows, stages, chunk)
        rt.allow_shared(OP, instance, rt.device_index(device), shared, HEADERS)
    kernel = rt.get_kernel(OP, instance, device, HEADERS)
    args = (
        rt.ptr(out),
        rt.ptr(x),
        rt.i64(x.stride(0)),
        rt.ptr(weight.tiles if packed else weight.weight),
        rt.ptr(weight.scale_inv),
        rt.i32(n),
        rt.i32(k),
        rt.i32(num_k_blocks),
    )
    grid = (num_row_blocks * splits,)
    rt.launch(kernel, grid, (THREADS,), args, device, shared_mem=shared, clustered=splits > 1)
    return out
