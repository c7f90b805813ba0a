"""CUDA launcher of the tensor-core bf16 skinny GEMM (`bf16_mma_gemv`, 1..64 x rows).

Imports torch and kernels.runtime. Same signature and results (to bf16 output rounding) as
`reference.bf16_linear` where `supports` says yes: bf16 x of 1..MAX_ROWS dense 16-byte-aligned
rows, a contiguous 16-byte-aligned bf16 weight [N, K] with K a multiple of 8, both on one sm_80+
GPU (mma.sync with bf16 operands, cp.async). Compile-checked only: whether it beats cuBLAS is
not measured yet, so `mma_preferred` routes nothing until ROUTE_ROWS is set (dispatch asks it;
`python -m ninfer.bench.kernel_bench --gemv-shapes --gemv-rows 16,32,64` measures it).

The plan (`plan`, pure Python): 8 warps x MT m-tiles of 16 weight rows per block (128 MT rows),
ceil(M / 8) n-tiles of x rows, and K split across blocks (grid.y) where the row tiles alone would
leave SMs idle (N = 5,120: 40 row tiles of 128 for 132 SMs); split blocks write fp32 partials and
the last block of each row tile adds them in split order and rounds once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.bf16_gemv.launch import operand_problem

OP = "bf16_mma_gemv"
THREADS = 256  # 8 warps (the .cu's bmg::kWarps)
WARPS = THREADS // 32
MAX_ROWS = 64  # x rows: 8 n-tiles of 8
CHUNK = 128  # k per staged chunk of x (bmg::kChunk)
PAD = 32  # bf16 past CHUNK per staged row (bmg::kPad): 320-byte rows, no bank conflicts
MIN_SPLIT_CHUNKS = 4  # a K split covers at least 4 chunks (512 k) unless K is shorter
# (m-tiles per warp, ring depth) -> blocks per SM the launch bounds budget registers for; nvcc
# sm_90 -Xptxas -v, no spills: MT = 1, D = 4: 73-120 registers (NT = 1..8); MT = 1, D = 2: 113 at
# NT = 8; MT = 2, D = 2: 150 at NT = 8; MT = 2, D = 4: 182 at NT = 8.
BLOCKS_PER_SM = {1: 2, 2: 1}
VARIANTS = ((1, 4), (1, 2), (2, 2), (2, 4))  # the (MT, D) instances the launcher may request
M_TILES, DEPTH = 1, 4  # the default variant (kernel_bench times the others beside it)

# Routing (dispatch.linear): OFF until measured. ROUTE_ROWS: the inclusive range of x row counts
# dispatch sends to the kernel (None: none); ROUTE_MIN_WEIGHTS: only weights of at least N x K
# this many; ROUTE_SHAPES: if given, only these (N, K).
ROUTE_ROWS: tuple[int, int] | None = None
ROUTE_MIN_WEIGHTS = 0
ROUTE_SHAPES: frozenset[tuple[int, int]] | None = None


@dataclass(frozen=True)
class Plan:
    """A launch: NT n-tiles, MT m-tiles per warp, ring depth D, grid (tiles, splits), and the
    chunks of CHUNK k each split covers (the last split may cover fewer)."""

    n_tiles: int
    m_tiles: int
    depth: int
    tiles: int
    splits: int
    split_chunks: int

    @property
    def rows_per_block(self) -> int:
        return 16 * WARPS * self.m_tiles

    @property
    def shared_mem(self) -> int:
        """Dynamic shared memory: two buffers of 8 NT staged rows of CHUNK + PAD bf16."""
        return 2 * 8 * self.n_tiles * (CHUNK + PAD) * 2

    @property
    def instance(self) -> str:
        return f"bf16_mma_gemv<{self.n_tiles}, {self.m_tiles}, {self.depth}>"


def plan(
    num_rows: int,
    n: int,
    k: int,
    num_sms: int,
    *,
    m_tiles: int = M_TILES,
    depth: int = DEPTH,
) -> Plan:
    """The launch for x [num_rows, k] against W [n, k] on a GPU of `num_sms` SMs.

    Row tiles of 128 MT rows; K split into as many ranges of whole chunks as the tiles leave room
    for within one wave (BLOCKS_PER_SM blocks per SM), each at least MIN_SPLIT_CHUNKS chunks, and
    none empty. 27B on 132 SMs, MT = 1: gate-up 34,816 rows -> 272 tiles, no split; in_proj
    16,480 -> 129 x 2; qkv 14,336 -> 112 x 2; out_proj / down 5,120 -> 40 x 6.
    """
    if (m_tiles, depth) not in VARIANTS:
        raise rt.KernelInputError(f"(m_tiles, depth) {(m_tiles, depth)} not one of {VARIANTS}")
    if not 1 <= num_rows <= MAX_ROWS or n < 1 or k < 1:
        raise rt.KernelInputError(f"no plan for {num_rows} x rows against [{n}, {k}]")
    tiles = -(-n // (16 * WARPS * m_tiles))
    chunks = -(-k // CHUNK)
    slots = num_sms * BLOCKS_PER_SM[m_tiles]
    splits = max(1, min(slots // tiles, chunks // MIN_SPLIT_CHUNKS))
    split_chunks = -(-chunks // splits)
    splits = -(-chunks // split_chunks)  # no empty split
    return Plan(-(-num_rows // 8), m_tiles, depth, tiles, splits, split_chunks)


def mma_preferred(num_rows: int, out_features: int, in_features: int) -> bool:
    """Whether dispatch should run this kernel rather than cuBLAS (the ROUTE_* constants; all
    off until measured). Operand limits are `supports`' business."""
    if ROUTE_ROWS is None or not ROUTE_ROWS[0] <= num_rows <= ROUTE_ROWS[1]:
        return False
    if not 1 <= num_rows <= MAX_ROWS or out_features * in_features < ROUTE_MIN_WEIGHTS:
        return False
    return ROUTE_SHAPES is None or (out_features, in_features) in ROUTE_SHAPES


def _problem(x: torch.Tensor, weight: torch.Tensor) -> str | None:
    """Why the kernel cannot take these operands, or None when it can: the bf16 GEMV's operand
    rules with this kernel's row limit."""
    return operand_problem(x, weight, max_rows=MAX_ROWS, kernel="bf16 mma GEMV")


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel takes these operands (otherwise F.linear runs)."""
    return _problem(x, weight) is None


COUNTERS_MIN = 4096  # row-tile counters allocated at least (lm_head, 248,320 rows: 1,940 tiles)
_counters: dict[torch.device, torch.Tensor] = {}


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """The device's int32 row-tile counters of the split reduction, zero between launches (each
    launch's last block per tile wraps its counter back to 0). Allocated zeroed on first use, or
    larger when a launch needs more; launches that use them must not run concurrently on two
    streams (every ninfer launch goes on torch's current stream)."""
    have = _counters.get(device)
    if have is None or have.numel() < tiles:
        have = torch.zeros(max(tiles, COUNTERS_MIN), dtype=torch.int32, device=device)
        _counters[device] = have
    return have


def bf16_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    *,
    m_tiles: int = M_TILES,
    depth: int = DEPTH,
) -> torch.Tensor:
    """See `reference.bf16_linear`: [M, N] bf16. `m_tiles`, `depth` pick another compiled
    variant (VARIANTS; kernel_bench compares them)."""
    device = rt.check_cuda(x, weight)
    problem = _problem(x, weight)
    if problem is not None:
        raise rt.KernelInputError(f"bf16 mma GEMV: {problem}")
    num_rows = x.shape[0]
    n, k = weight.shape
    p = plan(num_rows, n, k, rt.num_sms(device), m_tiles=m_tiles, depth=depth)
    out = torch.empty((num_rows, n), dtype=x.dtype, device=device)
    partial = counters = None
    if p.splits > 1:
        partial = torch.empty((p.splits, num_rows, n), dtype=torch.float32, device=device)
        counters = tile_counters(device, p.tiles)
    kernel = rt.get_kernel(OP, p.instance, device)
    args = (
        rt.ptr(out),
        rt.ptr(partial),
        rt.ptr(counters),
        rt.ptr(x),
        rt.i64(x.stride(0)),
        rt.ptr(weight),
        rt.i32(num_rows),
        rt.i32(n),
        rt.i32(k),
        rt.i32(p.split_chunks),
    )
    rt.launch(kernel, (p.tiles, p.splits), (THREADS,), args, device, shared_mem=p.shared_mem)
    return out
