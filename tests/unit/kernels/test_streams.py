"""kernels/streams.py: `dispatch.linear_pair`, two projections of one x, the second forked onto a
side stream at decode sizes on CUDA. Same kernels, so the bits must equal the two launches one
after the other, eagerly and replayed from a CUDA graph; a chain of layers that consumes both
outputs and reuses their memory would differ if a fork or join were missing (a read before the
side GEMV wrote, or a block reused while the other stream still read it)."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch, streams
from support.gpu_checks import capture_graph


def test_on_the_cpu_it_is_the_two_projections():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 64, generator=gen)
    big, small = torch.randn(40, 64, generator=gen), torch.randn(6, 64, generator=gen)
    first, second = dispatch.linear_pair(x, big, small)
    assert torch.equal(first, dispatch.linear(x, big))
    assert torch.equal(second, dispatch.linear(x, small))


def _chain(x: torch.Tensor, layers: list) -> torch.Tensor:
    """Each layer: half of x plus qkvz's first columns scaled by a sigmoid of b and a; both
    outputs consumed and dropped before the next layer allocates its own."""
    for big, small in layers:
        qkvz, ba = dispatch.linear_pair(x, big, small)
        b, a = ba.split(ba.shape[1] // 2, dim=-1)
        gate = torch.sigmoid(b - a).mean(dim=-1, keepdim=True)
        x = ((x + qkvz[:, : x.shape[1]] * gate) * 0.5).to(x.dtype)
    return x


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4, 8, 9])
def test_the_fork_gives_the_bits_of_the_two_launches_eager_and_in_a_graph(rows, monkeypatch):
    """fp8 qkv/z beside bf16 b/a as the fp8 DeltaNet layer runs them (9 rows: no fork), over a
    chain of 12 layers."""
    from support.gpu_checks import fp8_weight

    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    gen = torch.Generator("cuda").manual_seed(torch.seed() % 2**31)
    k = 2048
    layers = [
        (fp8_weight(k + 128 * (i % 2), k),
         (torch.randn(96, k, device="cuda", generator=gen) * k**-0.5).to(torch.bfloat16))
        for i in range(12)
    ]  # fmt: skip
    x = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "linear_pair")
    want = _chain(x, layers)
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    assert torch.equal(_chain(x, layers), want)
    graph, out = capture_graph(lambda: _chain(x, layers))
    for _ in range(3):
        out.zero_()
        graph.replay()
        assert torch.equal(out, want)


@pytest.mark.gpu
def test_the_side_stream_is_one_per_device_and_a_fork_from_it_runs_in_place():
    device = torch.device("cuda")
    side = streams.side_stream(device)
    assert streams.side_stream(torch.device("cuda", torch.cuda.current_device())) is side
    with torch.cuda.stream(side):
        assert streams.beside(lambda: 1, lambda: 2, device) == (1, 2)


# --- the opt-in L2 prefetch of a later GEMV's weights (kernels/l2_prefetch) ---


def test_the_prefetch_plan_is_a_lane_per_piece_and_at_most_a_block_an_sm():
    from ninfer.kernels.l2_prefetch import launch as l2

    assert l2.plan_launch(16, 132) == (1,)
    assert l2.plan_launch(l2.PIECE * l2.THREADS * 10, 132) == (10,)
    assert l2.plan_launch(l2.PIECE * l2.THREADS * 10 + 16, 132) == (11,)
    assert l2.plan_launch(2**30, 132) == (132,)


def test_prefetch_ahead_is_off_unless_named_and_off_the_gpu(monkeypatch):
    x, w = torch.randn(1, 64), torch.randn(32, 64)
    monkeypatch.setenv("NINFER_KERNELS_ON", "l2_prefetch")
    assert dispatch.prefetch_ahead(x, w) is None  # a CPU tensor
    dispatch.join(None)  # nothing to join


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 4])
def test_prefetched_chains_give_the_same_bits_eager_and_in_a_graph(rows, monkeypatch):
    """Each layer forks a prefetch of the next layer's fp8 weight (and a bf16 one past the
    PREFETCH_MAX_BYTES cap), joins before its GEMV: the bits of the chain without prefetches."""
    from support.gpu_checks import fp8_weight

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the bulk L2 prefetch needs sm_90")
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    gen = torch.Generator("cuda").manual_seed(torch.seed() % 2**31)
    k = 2048
    rows_cap = dispatch.PREFETCH_MAX_BYTES // (k * 2)
    big16 = (torch.randn(rows_cap + 64, k, device="cuda", generator=gen) * k**-0.5).to(
        torch.bfloat16
    )
    weights = [fp8_weight(k, k), big16[:k], fp8_weight(k, k)]
    targets = [fp8_weight(k, k), big16, fp8_weight(k, k)]
    x0 = torch.randn(rows, k, device="cuda", generator=gen).to(torch.bfloat16)

    def chain() -> torch.Tensor:
        x = x0
        for w, t in zip(weights, targets, strict=True):
            ahead = dispatch.prefetch_ahead(x, t)
            x = torch.tanh(dispatch.linear(x, w).float()).to(torch.bfloat16)
            dispatch.join(ahead)
        return x

    want = chain()
    monkeypatch.setenv("NINFER_KERNELS_ON", "l2_prefetch")
    assert dispatch.prefetch_ahead(x0, targets[0]) is not None
    dispatch.join(dispatch.prefetch_ahead(x0, targets[1]))
    assert torch.equal(chain(), want)
    graph, out = capture_graph(chain)
    out.zero_()
    graph.replay()
    assert torch.equal(out, want)
