"""The one-launch expert sort (`expert_sort`): its routing switch and operand checks (CPU), and
on the GPU bit for bit against the torch twin (`expert_gemv.reference.expert_groups`)."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch, runtime
from ninfer.kernels.expert_gemv import reference as expert_ref
from ninfer.kernels.moe_routing import launch as routing_cuda


def test_routed_and_the_twin_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    assert routing_cuda.SORT_ROUTED is True  # since run V1 measured it (docs/perf.md)
    ids = torch.tensor([3, 1, 3, 0, 1, 3])
    order, ends = dispatch.expert_groups(ids, 4)
    assert order.tolist() == [3, 1, 4, 0, 2, 5] and ends.tolist() == [1, 3, 3, 6]
    monkeypatch.setattr(routing_cuda, "SORT_ROUTED", True)
    assert not routing_cuda.supports_sort(ids, 4)  # CPU ids: the twin
    assert torch.equal(dispatch.expert_groups(ids, 4)[0], order)


def test_supports_and_errors() -> None:
    ids = torch.zeros(8, dtype=torch.int64)
    assert not routing_cuda.supports_sort(ids, 256)  # on the CPU
    with pytest.raises(runtime.KernelInputError, match="CUDA"):
        routing_cuda.expert_sort(ids, 256)


def test_routing_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a GPU (device checks stubbed): the kernel only with SORT_ROUTED, within its limits,
    and not with `expert_sort` in NINFER_KERNELS_OFF."""
    calls: list[int] = []
    monkeypatch.setattr(dispatch, "use_cuda_kernels", lambda t, op=None: op == "expert_sort")
    monkeypatch.setattr(routing_cuda, "supports_sort", lambda ids, e: ids.numel() <= 2048)
    monkeypatch.setattr(
        routing_cuda, "expert_sort", lambda ids, e: calls.append(ids.numel()) or (ids, ids)
    )
    small, big = torch.zeros(512, dtype=torch.int64), torch.zeros(4096, dtype=torch.int64)
    for routed, want in ((False, []), (True, [512])):
        monkeypatch.setattr(routing_cuda, "SORT_ROUTED", routed)
        calls.clear()
        dispatch.expert_groups(small, 256)
        dispatch.expert_groups(big, 256)  # past SORT_MAX_ASSIGNMENTS: the twin
        assert calls == want


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,top_k,experts", [(1, 8, 256), (17, 8, 256), (64, 8, 256),
                                                  (96, 8, 256), (256, 8, 256), (5, 3, 7),
                                                  (300, 4, 1024)])  # fmt: skip
@pytest.mark.parametrize("form", ["table", "count"])
def test_equals_the_twin_bit_for_bit(
    tokens: int, top_k: int, experts: int, form: str, gen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stable: the same order and ends as torch's stable sort and searchsorted, skewed choices
    (a few hot experts chosen by many tokens) included; the opt-in chunk table (where it fits)
    and the O(A^2) count alike."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if form == "table":
        monkeypatch.setenv("NINFER_KERNELS_ON", routing_cuda.SORT_TABLE)
    else:
        monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    hot = torch.randint(0, experts, (max(1, experts // 16),), device="cuda", generator=gen)
    pick = torch.randint(0, experts, (tokens, top_k), device="cuda", generator=gen)
    skew = torch.rand(tokens, top_k, device="cuda", generator=gen) < 0.5
    ids = torch.where(skew, hot[pick % hot.numel()], pick).reshape(-1)
    order, ends = routing_cuda.expert_sort(ids, experts)
    want_order, want_ends = expert_ref.expert_groups(ids, experts)
    assert torch.equal(ends, want_ends) and ends.dtype == torch.int32
    assert torch.equal(order, want_order) and order.dtype == torch.int64


@pytest.mark.gpu
def test_replays_in_a_graph_and_skips_out_of_range_ids(
    gen, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from support.gpu_checks import capture_graph

    ids = torch.randint(0, 256, (512,), device="cuda", generator=gen)
    graph, (order, ends) = capture_graph(lambda: routing_cuda.expert_sort(ids, 256))
    ids.copy_(torch.randint(0, 256, (512,), device="cuda", generator=gen))
    graph.replay()
    want_order, want_ends = expert_ref.expert_groups(ids, 256)
    assert torch.equal(order, want_order) and torch.equal(ends, want_ends)
    bad = torch.tensor([2, 9, 1, -1, 2], device="cuda")  # 9 and -1 are no expert of 4
    monkeypatch.setenv("NINFER_KERNELS_ON", routing_cuda.SORT_TABLE)
    for table in (True, False):
        monkeypatch.setattr(routing_cuda, "SORT_TABLE_SMEM", 48 * 1024 if table else 0)
        order, ends = routing_cuda.expert_sort(bad, 4)
        assert ends.tolist() == [0, 1, 3, 3] and order[:3].tolist() == [2, 0, 4]
