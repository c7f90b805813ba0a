"""The tensor-core bf16 GEMV (`bf16_tc_gemv`) against an fp64 product and `F.linear` (GPU only).

Fresh random bf16 operands per test. bf16 x times bf16 weights is exact in the mma's fp32
products; sums differ from cuBLAS's only in order, so each x row is held to 1e-2 relative error
against the fp64 product (bf16 output rounding with cancellation) and to the same against
F.linear; the ring depths and split counts must agree with each other to that tolerance, and a
split count gives the same bits on every call (fixed reduction order).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.support.gpu_checks import bf16_operands, capture_graph

from ninfer.kernels import dispatch
from ninfer.kernels.bf16_tc_gemv import launch as tc
from ninfer.kernels.fp8_gemv.tiles import attach_tiles, attached_tiles

pytestmark = pytest.mark.gpu
TOL = 1e-2
# 27B decode projections (gate-up, down, DeltaNet in_proj, out / o_proj, attention qkv), then
# shapes off the 128-row and 64-k grids: N tails, K = 8 * odd, a single row, a single k block
SHAPES = [
    (34816, 5120),
    (5120, 17408),
    (16480, 5120),
    (5120, 6144),
    (14336, 5120),
    (1000, 264),
    (130, 4104),
    (48, 64),
    (1, 8),
]


def _assert_rows_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert torch.isfinite(got).all(), what
    for r in range(got.shape[0]):
        err = ((got[r].double() - want[r].double()).norm() / want[r].double().norm()).item()
        assert err < TOL, f"x row {r}: relative error {err:.2e} against {what}"


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("n,k", SHAPES)
def test_tc_gemv_matches_fp64_and_cublas(rows: int, n: int, k: int, gen) -> None:
    x, w = bf16_operands(rows, n, k, gen)
    assert tc.supports(x, w)
    got = tc.bf16_linear(x, w)
    assert got.shape == (rows, n) and got.dtype == torch.bfloat16
    _assert_rows_close(got, x.double() @ w.double().T, "the fp64 product")
    if n >= 128:  # a few outputs with cancellation: F.linear's own rounding is the 1e-2 there
        _assert_rows_close(got, F.linear(x, w), "F.linear")


@pytest.mark.parametrize("stages", tc.STAGES)
@pytest.mark.parametrize("splits", (1, 2, 4, 8))
@pytest.mark.parametrize("n,k", [(640, 2048), (300, 264), (5120, 6144)])
def test_every_plan_gives_the_product(stages: int, splits: int, n: int, k: int, gen) -> None:
    """Each cluster size and ring depth, splits left without k blocks included (k = 264: 5
    blocks, 8 splits), and the same bits on a second call."""
    x, w = bf16_operands(8, n, k, gen)
    got = tc.bf16_linear(x, w, splits=splits, stages=stages)
    _assert_rows_close(got, x.double() @ w.double().T, f"fp64, {splits} splits, {stages} stages")
    assert torch.equal(got, tc.bf16_linear(x, w, splits=splits, stages=stages))


def test_strided_rows_and_a_graph_replay(gen) -> None:
    x, w = bf16_operands(4, 5120, 5120, gen)
    wide = torch.zeros(4, 5120 + 64, device="cuda", dtype=torch.bfloat16)
    view = wide[:, :5120]  # rows 16-byte aligned, stride != K
    view.copy_(x)
    assert tc.supports(view, w)
    assert torch.equal(tc.bf16_linear(view, w), tc.bf16_linear(x, w))
    graph, out = capture_graph(lambda: tc.bf16_linear(x, w))
    x.copy_(torch.randn(4, 5120, device="cuda", generator=gen).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    _assert_rows_close(out, x.double() @ w.double().T, "the fp64 product after replay")


def test_dispatch_routes_long_rows_and_the_switches(gen, monkeypatch) -> None:
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    x, w = bf16_operands(2, 14336, 5120, gen)
    assert not dispatch.bf16_tc_routed(x, w)  # wide: cuBLAS
    down_x, down = bf16_operands(4, 512, 17408, gen)
    assert dispatch.bf16_tc_routed(down_x, down)  # long rows
    assert torch.equal(dispatch.linear(down_x, down), tc.bf16_linear(down_x, down))
    assert not dispatch.bf16_tc_routed(down_x[:1], down)  # one row: the CUDA-core GEMV
    monkeypatch.setenv("NINFER_KERNELS_OFF", "bf16_tc_gemv")
    assert not dispatch.bf16_tc_routed(down_x, down)
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    monkeypatch.setenv("NINFER_KERNELS_ON", "bf16_tc_gemv")
    assert dispatch.bf16_tc_routed(x, w)
    assert torch.equal(dispatch.linear(x, w), tc.bf16_linear(x, w))
    assert not dispatch.bf16_tc_routed(torch.randn(9, 5120, device="cuda").bfloat16(), w)


def test_rejects_what_it_does_not_take(gen) -> None:
    x, w = bf16_operands(1, 48, 64, gen)
    assert not tc.supports(torch.randn(9, 64, device="cuda").bfloat16(), w)  # > MAX_ROWS
    assert not tc.supports(x.float(), w)
    odd = torch.randn(48, 68, device="cuda").bfloat16()  # K % 8 != 0
    assert not tc.supports(torch.randn(1, 68, device="cuda").bfloat16(), odd)
    with pytest.raises(tc.Bf16TcError, match="tensor-core bf16 GEMV"):
        tc.bf16_linear(x.float(), w)
    with pytest.raises(tc.Bf16TcError, match="stages"):
        tc.bf16_linear(x, w, stages=5)
    with pytest.raises(tc.Bf16TcError, match="splits"):
        tc.bf16_linear(x, w, splits=3)


@pytest.mark.parametrize("rows", [1, 4, 8])
@pytest.mark.parametrize("n,k", [(5120, 17408), (5120, 6144), (1000, 264), (130, 4104), (48, 64)])
def test_packed_tiles_give_the_row_major_bits(rows: int, n: int, k: int, gen) -> None:
    """Tiles attached to the weight (zero-padded past N and K) put the same bytes in the same
    ring slots: the row-major launch's bits at every split count and ring depth."""
    x, plain = bf16_operands(rows, n, k, gen)
    tiled = plain.clone()
    attach_tiles(tiled)
    assert attached_tiles(plain) is None and attached_tiles(tiled) is not None
    for splits in (None, 1, 2, 8):
        for stages in (None, 2):
            want = tc.bf16_linear(x, plain, splits=splits, stages=stages)
            got = tc.bf16_linear(x, tiled, splits=splits, stages=stages)
            assert torch.equal(got, want), f"{splits} splits, {stages} stages"


def test_bound_tiles_are_read_through_dispatch_and_can_be_switched_off(gen, monkeypatch) -> None:
    """`qwen3_5._tiled` with `NINFER_KERNELS_ON=bf16_tiles` attaches tiles to the projections
    the tensor-core GEMV takes (a K >= 3N down projection here, not the gate-up), dispatch's
    launch reads them (zeroed tiles change the product), `NINFER_KERNELS_OFF=bf16_tiles` reads
    the rows again, and the bits are the untiled weight's."""
    from ninfer.model.layers.mlp import MlpWeights
    from ninfer.model.qwen3_5 import _tiled

    x, down = bf16_operands(4, 256, 1024, gen)
    gate = torch.randn(1024, 256, device="cuda", generator=gen).to(torch.bfloat16)
    want = dispatch.linear(x, down)
    monkeypatch.setenv("NINFER_KERNELS_ON", "bf16_tiles")
    w = _tiled(MlpWeights(gate_proj=gate, up_proj=gate.clone(), down_proj=down.clone()))
    assert attached_tiles(w.down_proj) is not None and attached_tiles(w.gate_proj) is None
    assert torch.equal(dispatch.linear(x, w.down_proj), want)
    attached_tiles(w.down_proj).zero_()
    assert not torch.equal(dispatch.linear(x, w.down_proj), want)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "bf16_tiles")
    assert torch.equal(dispatch.linear(x, w.down_proj), want)
