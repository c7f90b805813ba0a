"""The tensor-core bf16 skinny GEMM against an fp64 product and cuBLAS, split and unsplit, every
compiled variant, in graphs and through dispatch with the routing constant switched on (GPU).

Fresh random operands per test (the conftest `gen`). Tolerances as test_bf16_gemv_gpu.py's: the
kernel's bf16 products are exact in fp32 and summed in fp32 (inside the tensor core, whose adds
truncate rather than round, then across K splits in fp32), and each output is rounded once, so
against the fp64 product every element obeys |got - exact| <= 2^-8 |exact| + 2e-5 sum |x| |w|,
and the norm-relative error, against fp64 and against cuBLAS, is held to 1e-2.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch
from ninfer.kernels.bf16_mma_gemv import launch as mma
from support.gpu_checks import bf16_operands, capture_graph, check_bf16_product, rel

pytestmark = pytest.mark.gpu
TOL = 1e-2

SHAPES = [
    pytest.param(34816, 5120, id="27b-gate-up"),
    pytest.param(5120, 17408, id="27b-down"),
    pytest.param(16480, 5120, id="27b-in-proj"),
    pytest.param(14336, 5120, id="27b-qkv"),
    pytest.param(5120, 6144, id="27b-out-proj"),
    pytest.param(12352, 2048, id="35b-in-proj"),
    pytest.param(9216, 2048, id="35b-qkv"),
    pytest.param(2048, 4096, id="35b-out-proj"),
    pytest.param(1003, 520, id="odd-n-k-off-the-chunk"),
    pytest.param(37, 8, id="one-piece"),
]
ROWS = [9, 16, 24, 33, 64]


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("n,k", SHAPES)
def test_mma_gemv_matches_fp64(rows: int, n: int, k: int, gen) -> None:
    x, w = bf16_operands(rows, n, k, gen)
    assert mma.supports(x, w)
    got = mma.bf16_linear(x, w)
    check_bf16_product(got, x, w)
    assert rel(got, F.linear(x, w)) < TOL
    assert torch.equal(mma.bf16_linear(x, w), got)  # split sums in a fixed order


@pytest.mark.parametrize("variant", mma.VARIANTS, ids=lambda v: f"mt{v[0]}-d{v[1]}")
@pytest.mark.parametrize("rows", [1, 8, 13, 40, 64])
@pytest.mark.parametrize("n,k", [(5120, 6144), (12352, 2048), (1003, 520)])
def test_every_variant(variant, rows: int, n: int, k: int, gen) -> None:
    x, w = bf16_operands(rows, n, k, gen)
    check_bf16_product(mma.bf16_linear(x, w, m_tiles=variant[0], depth=variant[1]), x, w)


def test_lm_head_width(gen) -> None:
    """248,320 rows (1,940 row tiles, more than the counters' minimum would need if split)."""
    x, w = bf16_operands(16, 248320, 5120, gen)
    check_bf16_product(mma.bf16_linear(x, w), x, w)


def test_row_views_and_strided_x(gen) -> None:
    """A weight that is a row slice of a merged matrix and x rows with a 16-byte-multiple stride."""
    x_wide, _ = bf16_operands(24, 1, 2048 + 64, gen)
    _, merged = bf16_operands(1, 9000, 2048, gen)
    w = merged[1000:7000]
    x = x_wide[:, 64:]
    assert w.storage_offset() > 0 and x.stride(0) == 2048 + 64 and mma.supports(x, w)
    check_bf16_product(mma.bf16_linear(x, w), x, w)


@pytest.mark.parametrize("n,k", [(5120, 17408), (34816, 5120)], ids=["split", "unsplit"])
def test_is_recorded_by_a_cuda_graph(n: int, k: int, gen) -> None:
    """Replays give the eager bits (the split counters are back at zero after every launch)."""
    x, w = bf16_operands(64, n, k, gen)
    graph, out = capture_graph(lambda: mma.bf16_linear(x, w))
    for _ in range(3):
        x.copy_(torch.randn(64, k, device="cuda", generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, mma.bf16_linear(x, w))
        check_bf16_product(out, x, w)
    assert not mma.tile_counters(x.device, 1).any()


def test_dispatch_routes_only_with_the_constant_on(gen, monkeypatch) -> None:
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    monkeypatch.delenv("NINFER_KERNELS", raising=False)
    x, w = bf16_operands(32, 5120, 6144, gen)
    assert mma.ROUTE_ROWS is None
    assert not dispatch.bf16_mma_routed(x, w)
    assert torch.equal(dispatch.linear(x, w), F.linear(x, w))
    monkeypatch.setattr(mma, "ROUTE_ROWS", (9, 64))
    assert dispatch.bf16_mma_routed(x, w)
    assert torch.equal(dispatch.linear(x, w), mma.bf16_linear(x, w))
    graph, out = capture_graph(lambda: dispatch.linear(x, w))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, mma.bf16_linear(x, w))
    # rows outside the range, fp32, strided x rows: F.linear bit for bit
    eight = torch.randn(8, 6144, device="cuda", generator=gen).to(torch.bfloat16)
    odd_stride = torch.randn(16, 6148, device="cuda", generator=gen).to(torch.bfloat16)[:, :6144]
    for xx, ww in ((eight, w), (x.float(), w.float()), (odd_stride, w)):
        assert not dispatch.bf16_mma_routed(xx, ww)
        assert torch.equal(dispatch.linear(xx, ww), F.linear(xx, ww))
    monkeypatch.setenv("NINFER_KERNELS_OFF", "bf16_mma_gemv")
    assert not dispatch.bf16_mma_routed(x, w)
    assert torch.equal(dispatch.linear(x, w), F.linear(x, w))
