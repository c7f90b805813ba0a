"""The stream form of the tensor-core fp8 GEMV (`launch_tc`, `fp8_tc_gemv_stream`; GPU only).

It cuts the weight's (row block, k block) tiles into one contiguous run per block, so the checks
are the run boundaries: every x row within 1e-2 of the fp64 product (bf16 outputs) at the routed
grid and at grids that cut row blocks anywhere (1, 7, 131, 397 blocks and one tile per block:
every row block summed from all its contributors); one block gives the single-split ring's bits
(no cuts: the same sums in the same order); the result is deterministic, the same for every x row
count, replays in a CUDA graph and leaves the per-row-block counters at zero.
"""

from __future__ import annotations

import pytest
import torch
from tests.support.gpu_checks import capture_graph
from tests.unit.kernels.test_fp8_tc_gpu import SHAPES, _assert_rows_close, _exact, _weight, _x

from ninfer.kernels import dispatch
from ninfer.kernels.fp8_gemv import launch_tc as tc_cuda

pytestmark = pytest.mark.gpu
TOL = 1e-2


def _counters_zero() -> bool:
    return all(int(c.count_nonzero()) == 0 for _, c in tc_cuda._STREAM_WORKSPACE.values())


@pytest.mark.parametrize("rows", [1, 2, 5, 8])
@pytest.mark.parametrize("n,k", SHAPES)
def test_stream_form_gives_the_product(rows: int, n: int, k: int, gen) -> None:
    weight = _weight(n, k)
    x = _x(rows, k, torch.bfloat16, gen)
    got = tc_cuda.fp8_linear(x, weight, stream_blocks=0)
    assert got.shape == (rows, n) and got.dtype == torch.bfloat16
    _assert_rows_close(got, _exact(x, weight), TOL, "fp64 product")
    assert torch.equal(got, tc_cuda.fp8_linear(x, weight, stream_blocks=0))  # deterministic
    assert _counters_zero()


@pytest.mark.parametrize("blocks", [1, 7, 131, 397, -1])
@pytest.mark.parametrize("n,k", [(5120, 6144), (1000, 272), (130, 4112), (34816, 5120)])
def test_any_cut_of_the_tiles_gives_the_product(blocks: int, n: int, k: int, gen) -> None:
    weight = _weight(n, k)
    tiles = weight.scale_inv.numel()
    blocks = tiles if blocks == -1 else min(blocks, tiles)  # -1: one tile per block
    x = _x(3, k, torch.bfloat16, gen)
    got = tc_cuda.fp8_linear(x, weight, stream_blocks=blocks)
    _assert_rows_close(got, _exact(x, weight), TOL, f"fp64 product on {blocks} blocks")
    assert _counters_zero()


@pytest.mark.parametrize("rows", [1, 4, 8])
@pytest.mark.parametrize("n,k", [(5120, 6144), (130, 4112), (14336, 5120)])
def test_one_block_gives_the_single_split_rings_bits(rows: int, n: int, k: int, gen) -> None:
    weight = _weight(n, k)
    x = _x(rows, k, torch.bfloat16, gen)
    want = tc_cuda.fp8_linear(x, weight, splits=1, stages=tc_cuda.ring_stages(rows))
    assert torch.equal(tc_cuda.fp8_linear(x, weight, stream_blocks=1), want)


def test_each_x_row_gets_the_same_bits_at_every_row_count(gen) -> None:
    weight = _weight(16480, 5120)
    x = _x(8, 5120, torch.bfloat16, gen)
    full = tc_cuda.fp8_linear(x, weight, stream_blocks=0)
    for rows in range(1, 8):
        assert torch.equal(tc_cuda.fp8_linear(x[:rows], weight, stream_blocks=0), full[:rows])


def test_stream_replays_in_a_graph_and_dispatch_routes_the_switch(gen, monkeypatch) -> None:
    weight = _weight(5120, 17408)
    x = _x(2, 17408, torch.bfloat16, gen)
    monkeypatch.setenv("NINFER_KERNELS_ON", "fp8_stream")
    assert torch.equal(dispatch.linear(x, weight), tc_cuda.fp8_linear(x, weight, stream_blocks=0))
    graph, out = capture_graph(lambda: dispatch.linear(x, weight))
    for _ in range(2):  # the counters the first replay leaves serve the second
        x.copy_(_x(2, 17408, torch.bfloat16, gen))
        graph.replay()
        torch.cuda.synchronize()
        _assert_rows_close(out, _exact(x, weight), TOL, "fp64 product after replay")
        assert torch.equal(out, tc_cuda.fp8_linear(x, weight, stream_blocks=0))
    assert _counters_zero()
    monkeypatch.delenv("NINFER_KERNELS_ON")
    assert not tc_cuda.stream_routed(40)


def test_stream_rejects_grids_off_the_tiles(gen) -> None:
    weight = _weight(48, 64)
    x = _x(1, 64, torch.bfloat16, gen)
    with pytest.raises(tc_cuda.Fp8TcError, match="stream blocks"):
        tc_cuda.fp8_linear(x, weight, stream_blocks=2)  # one tile
