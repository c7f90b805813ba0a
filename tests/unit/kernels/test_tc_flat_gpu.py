"""The flat reduction of the tensor-core GEMVs (`fp8_tc_gemv_ring` and `bf16_tc_gemv` with FLAT):
the k splits of a row block as plain blocks adding through an fp32 workspace, against the cluster
form (GPU only).

Both forms add the same S partial sums in the same split order, so they must agree bit for bit
on fresh random operands, at every split count, row count and shape (N and K off the 128 grids
included); the arrival counters must be back at zero after every launch, eager or replayed in a
CUDA graph, and a chain of flat launches (each reading the previous one's output, PDL-launched)
must give the cluster chain's bits: a launch that reused the workspace before its predecessor
finished would not.
"""

from __future__ import annotations

import pytest
import torch
from tests.support.gpu_checks import bf16_operands, capture_graph, fp8_hard_rows, fp8_weight

from ninfer.kernels import dispatch
from ninfer.kernels.bf16_tc_gemv import launch as bf16_tc
from ninfer.kernels.fp8_gemv import launch_tc as fp8_tc

pytestmark = pytest.mark.gpu
FP8_SHAPES = [(34816, 5120), (5120, 17408), (5120, 6144), (130, 4112), (300, 272)]
BF16_SHAPES = [(16480, 5120), (5120, 17408), (5120, 6144), (1000, 264), (130, 4104)]


def _counters_zero() -> bool:
    _, counters = fp8_tc.flat_workspace(torch.device("cuda"))
    return not bool(counters.any())


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("n,k", FP8_SHAPES)
def test_fp8_flat_gives_the_clusters_bits(rows: int, n: int, k: int, gen) -> None:
    weight = fp8_weight(n, k)
    x = fp8_hard_rows(rows, k, gen, torch.bfloat16)
    for splits in (2, 4, 8):
        want = fp8_tc.fp8_linear(x, weight, splits=splits, flat=False)
        got = fp8_tc.fp8_linear(x, weight, splits=splits, flat=True)
        assert torch.equal(got, want), f"{splits} splits"
        assert _counters_zero()


@pytest.mark.parametrize("rows", [1, 4, 8])
@pytest.mark.parametrize("n,k", BF16_SHAPES)
def test_bf16_flat_gives_the_clusters_bits(rows: int, n: int, k: int, gen) -> None:
    x, w = bf16_operands(rows, n, k, gen)
    for splits in (2, 4, 8):
        want = bf16_tc.bf16_linear(x, w, splits=splits, flat=False)
        got = bf16_tc.bf16_linear(x, w, splits=splits, flat=True)
        assert torch.equal(got, want), f"{splits} splits"
        assert _counters_zero()


def test_a_chain_of_flat_launches_in_a_graph(gen) -> None:
    """Four dependent launches per replay (bf16, fp8, bf16, fp8), each feeding the next: three
    replays on fresh inputs equal the cluster chain, and the counters end at zero."""
    w1 = bf16_operands(1, 5120, 6144, gen)[1]
    w2 = fp8_weight(6144, 5120)
    w3 = bf16_operands(1, 1000, 6144, gen)[1]
    w4 = fp8_weight(5120, 1000 + 24)  # K = 1,024: 8 k blocks
    x = torch.randn(4, 6144, device="cuda", generator=gen).to(torch.bfloat16)

    def chain(flat: bool) -> torch.Tensor:
        h = bf16_tc.bf16_linear(x, w1, splits=8, flat=flat)
        h = fp8_tc.fp8_linear(h, w2, splits=4, flat=flat)
        h = bf16_tc.bf16_linear(h, w3, splits=8, flat=flat)
        h = torch.nn.functional.pad(h, (0, 24))
        return fp8_tc.fp8_linear(h, w4, splits=2, flat=flat)

    graph, out = capture_graph(lambda: chain(True))
    for _ in range(3):
        x.copy_(torch.randn(4, 6144, device="cuda", generator=gen))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, chain(False))
        assert _counters_zero()


def test_routing_switch_and_checks(gen, monkeypatch) -> None:
    weight = fp8_weight(5120, 6144)  # 40 row blocks x 8 splits
    x = fp8_hard_rows(1, 6144, gen, torch.bfloat16)
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    assert not fp8_tc.flat_routed(40, 8)
    monkeypatch.setenv("NINFER_KERNELS_ON", "tc_flat")
    assert fp8_tc.flat_routed(40, 8)
    assert torch.equal(dispatch.linear(x, weight), fp8_tc.fp8_linear(x, weight, flat=True))
    with pytest.raises(fp8_tc.Fp8TcError, match="flat form"):
        fp8_tc.fp8_linear(x, weight, splits=1, flat=True)
    with pytest.raises(fp8_tc.Fp8TcError, match="register form"):
        fp8_tc.fp8_linear(x, weight, stages=0, flat=True)
    xb, wb = bf16_operands(2, 5120, 17408, gen)  # a long-row shape: routed to bf16_tc_gemv
    assert torch.equal(dispatch.linear(xb, wb), bf16_tc.bf16_linear(xb, wb, flat=True))
