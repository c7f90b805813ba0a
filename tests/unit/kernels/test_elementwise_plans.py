"""Launch plans of the elementwise kernels (silu_mul, gated_rms_norm, qk_norm_rope), on the CPU.

The kernels themselves run only on a GPU (test_elementwise_gpu.py); here the pure planning
functions are held to what the kernels assume: vector paths only on aligned inputs, and grids
that give every output element (or row) exactly one thread (or warp), replayed in Python with
the kernels' own index arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.kernels.gated_rms_norm import launch as gated
from ninfer.kernels.qk_norm_rope import launch as qk
from ninfer.kernels.silu_mul import launch as silu

BF16, FP32 = 2, 4  # element sizes
ALIGNED = 1 << 20  # a 16-byte-aligned device address


def _silu_writes(plan: silu.LaunchPlan, num_rows: int, inter: int, element_size: int):
    """How often each output element is written, replaying the kernel's index arithmetic."""
    (threads,) = plan.block
    if plan.kernel == "silu_mul_vec":
        per_vec = 16 // element_size
        grid_x, grid_y = plan.grid
        col_hits = np.zeros(inter, dtype=np.int64)
        starts = np.arange(grid_x * threads) * per_vec  # (blockIdx.x * blockDim.x + tid) * V
        for j in range(per_vec):
            np.add.at(col_hits, starts[starts < inter] + j, 1)
        row_hits = np.zeros(num_rows, dtype=np.int64)
        block_rows = np.arange(grid_y)  # for (row = blockIdx.y; row < num_rows; row += gridDim.y)
        while (block_rows < num_rows).any():
            np.add.at(row_hits, block_rows[block_rows < num_rows], 1)
            block_rows = block_rows + grid_y
        return row_hits[:, None] * col_hits[None, :]
    hits = np.zeros((num_rows, inter), dtype=np.int64)
    (grid_x,) = plan.grid
    idx = np.arange(grid_x * threads)
    idx = idx[idx < num_rows * inter]
    np.add.at(hits, (idx // inter, idx % inter), 1)
    return hits


def test_silu_prefill_shape_takes_the_vector_kernel() -> None:
    plan = silu.plan_launch(2048, 17408, 2 * 17408, ALIGNED, BF16)
    assert plan.kernel == "silu_mul_vec"
    assert plan.block == (256,)
    assert plan.grid == (-(-17408 // 8 // 256), 2048)  # 2,176 vectors a row: 9 blocks wide


@pytest.mark.parametrize(
    "inter,row_stride,data_ptr,element_size,why",
    [
        (17408, 2 * 17408 + 1, ALIGNED, BF16, "odd row stride"),
        (17408, 2 * 17408 + 4, ALIGNED, BF16, "row stride of 8 bytes"),
        (17408, 2 * 17408, ALIGNED + 2, BF16, "base off by one element"),
        (17408, 2 * 17408, ALIGNED + 8, FP32, "base off by two fp32"),
        (12, 24, ALIGNED, BF16, "up half starts at 24 bytes"),
        (6, 12, ALIGNED, FP32, "up half starts at 24 bytes"),
        (5, 10, ALIGNED, BF16, "odd width"),
    ],
)
def test_silu_unaligned_inputs_fall_back_to_the_scalar_kernel(
    inter: int, row_stride: int, data_ptr: int, element_size: int, why: str
) -> None:
    plan = silu.plan_launch(4, inter, row_stride, data_ptr, element_size)
    assert plan.kernel == "silu_mul", why


def test_silu_vector_width_follows_the_dtype() -> None:
    """12 fp32 are three 16-byte vectors (aligned); 12 bf16 are one and a half (not)."""
    assert silu.plan_launch(3, 12, 24, ALIGNED, FP32).kernel == "silu_mul_vec"
    assert silu.plan_launch(3, 12, 24, ALIGNED, BF16).kernel == "silu_mul"


def test_silu_rows_past_the_grid_limit_are_looped_over() -> None:
    plan = silu.plan_launch(200_000, 64, 128, ALIGNED, BF16)
    assert plan.kernel == "silu_mul_vec" and plan.grid[1] == silu.MAX_GRID_Y
    hits = _silu_writes(plan, 200_000, 64, BF16)
    assert (hits == 1).all()


@settings(max_examples=60, deadline=None)
@given(
    num_rows=st.integers(1, 12),
    num_vecs=st.integers(1, 700),  # past 256 threads: several blocks a row
    tail=st.sampled_from([0, 0, 1]),  # elements past whole vectors
    stride_extra=st.sampled_from([0, 0, 1, 16]),
    misalign=st.sampled_from([0, 0, 1]),
    element_size=st.sampled_from([BF16, FP32]),
)
def test_silu_every_output_element_is_written_once(
    num_rows: int, num_vecs: int, tail: int, stride_extra: int, misalign: int, element_size: int
) -> None:
    inter = num_vecs * (16 // element_size) + tail
    data_ptr = ALIGNED + misalign * element_size
    plan = silu.plan_launch(num_rows, inter, 2 * inter + stride_extra, data_ptr, element_size)
    assert plan.block[0] % 32 == 0 and plan.block[0] <= 1024
    assert all(g > 0 for g in plan.grid) and (len(plan.grid) < 2 or plan.grid[1] <= 65_535)
    assert (_silu_writes(plan, num_rows, inter, element_size) == 1).all()


def _aligned_spans(*sizes: int) -> list[tuple[int, int]]:
    return [(ALIGNED, size) for size in sizes]


def test_gated_norm_128_wide_heads_take_the_warp_kernel() -> None:
    """27B prefill: 2,048 tokens x 48 heads of 128, fp32 x, bf16 gate (token stride of a fused
    projection), weight and output."""
    rows = 2048 * 48
    spans = _aligned_spans(BF16, FP32, BF16, BF16) + [((2 * 48 * 128 + 64) * BF16, BF16)]
    plan = gated.plan_launch(128, rows, spans)
    assert plan.per_lane == 4
    assert plan.block == (32 * gated.WARPS_PER_BLOCK,)
    assert plan.grid == (rows // gated.WARPS_PER_BLOCK,)


@pytest.mark.parametrize("n,per_lane", [(32, 1), (64, 2), (128, 4), (256, 8)])
def test_gated_norm_lane_width_is_n_over_32(n: int, per_lane: int) -> None:
    assert gated.plan_launch(n, 10, _aligned_spans(FP32, BF16)).per_lane == per_lane


@pytest.mark.parametrize(
    "n,spans,why",
    [
        (16, _aligned_spans(FP32), "narrower than a warp"),
        (96, _aligned_spans(FP32), "3 a lane: no instance"),
        (512, _aligned_spans(FP32), "16 a lane: too many registers"),
        (130, _aligned_spans(FP32), "not a multiple of 32"),
        (128, [(ALIGNED + 8, FP32)], "fp32 x at 8 bytes (lane chunk is 16)"),
        (128, [(ALIGNED, FP32), (ALIGNED + 2, BF16)], "bf16 gate at 2 bytes (chunk is 8)"),
        (128, [(ALIGNED, FP32), ((2 * 48 * 128 + 7) * BF16, BF16)], "odd gate token stride"),
    ],
)
def test_gated_norm_falls_back_to_the_block_kernel(n: int, spans, why: str) -> None:
    plan = gated.plan_launch(n, 10, spans)
    assert plan.per_lane == 0, why
    assert plan.grid == (10,) and plan.block[0] % 32 == 0 and plan.block[0] >= min(n, 1024)


def test_gated_norm_bf16_chunk_of_four_needs_only_8_bytes() -> None:
    assert gated.plan_launch(128, 10, [(ALIGNED + 8, BF16)]).per_lane == 4


@pytest.mark.parametrize("num_rows", [1, 3, 4, 5, 48, 383, 384, 98304])
def test_gated_norm_warps_cover_every_row_once(num_rows: int) -> None:
    plan = gated.plan_launch(128, num_rows, _aligned_spans(FP32))
    warps_per_block = plan.block[0] // 32
    rows = np.arange(plan.grid[0] * warps_per_block)  # blockIdx.x * warps + warp, as the kernel
    assert np.array_equal(rows[rows < num_rows], np.arange(num_rows))
    assert plan.grid[0] * warps_per_block - num_rows < warps_per_block  # no empty block


def test_qk_norm_rope_warp_kernel_where_rotate_half_pairs_share_a_lane_slot() -> None:
    """E = D / 32 dims per lane, and R / 2 a multiple of E (a dim and its rotate-half partner sit
    at the same slot of lanes R / (2E) apart); else the block kernel serves the shape."""
    assert qk.per_warp_dims(256, 64) == 8  # 27B / 35B-A3B: 32 rotary pairs, lanes 4 apart
    assert qk.per_warp_dims(32, 16) == 1
    assert qk.per_warp_dims(512, 128) == 16
    assert qk.per_warp_dims(256, 0) == 8  # no rotary dims: the norm alone
    assert qk.per_warp_dims(256, 8) is None  # partner 4 dims away: inside one lane's slots
    assert qk.per_warp_dims(96, 32) is None  # E = 3
    assert qk.per_warp_dims(1024, 64) is None  # E = 32: past WARP_DIMS
    assert qk.per_warp_dims(48, 16) is None  # not a multiple of 32
