"""The bf16 GEMV's norm tail (GPU): the projection and the RMSNorm after it in one launch must give
exactly the bits of the two launches it replaces (`bf16_linear`, then the add_rms_norm kernel),
for every x row count, for the norm's register-resident shapes (one or two virtual threads per
thread of the GEMV's block, one to four vectors each), with and without a residual, launch after
launch and in graph replays (the completion counter must come back to zero each time), and
through dispatch's deferred projection when switched on. Fresh random operands per test."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch
from ninfer.kernels.add_rms_norm import launch as norm_cuda
from ninfer.kernels.bf16_gemv import launch as bf16_cuda
from support.gpu_checks import bf16_operands, capture_graph

pytestmark = pytest.mark.gpu
EPS = 1e-6

# (N, K): N sets the norm's shape (vec_plan: threads x vectors per thread)
SHAPES = [
    pytest.param(5120, 6144, id="27b-out-proj-320x2"),
    pytest.param(5120, 17408, id="27b-down-320x2"),
    pytest.param(2048, 4096, id="35b-o-proj-256x1"),
    pytest.param(4096, 1024, id="512x1"),
    pytest.param(8192, 512, id="512x2"),
    pytest.param(12288, 256, id="384x4"),
    pytest.param(1000, 520, id="odd-128x1"),
    pytest.param(64, 64, id="tiny-32x1"),
]


def _norm_operands(rows: int, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    residual = (torch.randn(rows, n, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    weight = (torch.randn(n, device="cuda", generator=gen) * 0.5).to(torch.bfloat16)
    return residual, weight


def _unfused(x, w, residual, norm_weight) -> tuple[torch.Tensor, torch.Tensor]:
    return norm_cuda.add_rms_norm(bf16_cuda.bf16_linear(x, w), residual, norm_weight, EPS)


@pytest.mark.parametrize("with_residual", [True, False], ids=["add", "norm"])
@pytest.mark.parametrize("rows", [1, 2, 4, 8])
@pytest.mark.parametrize("n,k", SHAPES)
def test_norm_tail_is_the_two_launches_bit_for_bit(rows, n, k, with_residual, gen) -> None:
    x, w = bf16_operands(rows, n, k, gen)
    residual, norm_weight = _norm_operands(rows, n, gen)
    residual = residual if with_residual else None
    assert bf16_cuda.norm_tail_problem(x, w, residual, norm_weight) is None
    want_normed, want_summed = _unfused(x, w, residual, norm_weight)
    for _ in range(3):  # each launch leaves its counter at zero for the next
        normed, summed = bf16_cuda.linear_norm(x, w, residual, norm_weight, EPS)
        assert torch.equal(normed, want_normed)
        assert torch.equal(summed, want_summed)
    if not with_residual:
        assert torch.equal(summed, bf16_cuda.bf16_linear(x, w))


def test_norm_tail_in_graph_replays(gen) -> None:
    """A captured launch keeps its counter: every replay must finish the norm again, on new x."""
    x, w = bf16_operands(1, 5120, 6144, gen)
    residual, norm_weight = _norm_operands(1, 5120, gen)
    graph, (normed, summed) = capture_graph(
        lambda: bf16_cuda.linear_norm(x, w, residual, norm_weight, EPS)
    )
    for _ in range(3):
        x.copy_(torch.randn(1, 6144, device="cuda", generator=gen).to(torch.bfloat16))
        residual.copy_(torch.randn(1, 5120, device="cuda", generator=gen).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        want_normed, want_summed = _unfused(x, w, residual, norm_weight)
        assert torch.equal(normed, want_normed) and torch.equal(summed, want_summed)


def test_norm_tail_problems_name_the_operand(gen) -> None:
    x, w = bf16_operands(1, 1004, 512, gen)  # 1004 % 8 != 0: no one-pass norm shape
    residual, norm_weight = _norm_operands(1, 1004, gen)
    assert "one-pass" in bf16_cuda.norm_tail_problem(x, w, residual, norm_weight)
    x, w = bf16_operands(2, 1024, 512, gen)
    residual, norm_weight = _norm_operands(1, 1024, gen)  # one residual row for two x rows
    assert "residual" in bf16_cuda.norm_tail_problem(x, w, residual, norm_weight)
    with pytest.raises(bf16_cuda.rt.KernelInputError, match="norm tail"):
        bf16_cuda.linear_norm(x, w, residual, norm_weight, EPS)
    residual, norm_weight = _norm_operands(2, 1024, gen)
    assert "bf16" in bf16_cuda.norm_tail_problem(x, w, residual, norm_weight.float())


def test_dispatch_defers_only_when_switched_on(gen, monkeypatch) -> None:
    """`project(defer=True)` gives a Pending only under NINFER_KERNELS_ON=gemv_norm_tail and only
    for the CUDA-core GEMV's shapes; `add_rms_norm` of it gives the unfused bits either way."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    x, w = bf16_operands(1, 5120, 17408, gen)
    residual, norm_weight = _norm_operands(1, 5120, gen)
    want = _unfused(x, w, residual, norm_weight)
    plain = dispatch.project(x, w, defer=True)
    assert isinstance(plain, torch.Tensor)
    monkeypatch.setenv("NINFER_KERNELS_ON", "gemv_norm_tail")
    pending = dispatch.project(x, w, defer=True)
    assert isinstance(pending, dispatch.Pending)
    assert isinstance(dispatch.project(x, w), torch.Tensor)  # not asked to defer
    got = dispatch.add_rms_norm(pending, residual, norm_weight, EPS)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # four rows of a 27B down projection go to the tensor-core GEMV: not deferred
    x4, w4 = bf16_operands(4, 5120, 17408, gen)
    assert isinstance(dispatch.project(x4, w4, defer=True), torch.Tensor)
    # a norm the tail does not take (fp32 weight): the projection, then the norm kernel
    got = dispatch.add_rms_norm(pending, residual, norm_weight.float(), EPS)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
