"""The one-launch expert sort (`expert_sort`): its routing switch and operand checks and its table
form's algorithm replayed (CPU), and on the GPU bit for bit against the torch twin
(`expert_gemv.reference.expert_groups`)."""

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


def _table_sort(ids: list[int], num_experts: int, threads: int) -> tuple[list[int], list[int]]:
    """expert_sort's table form replayed on the CPU, warp by warp: `__match_any_sync` as
    the lanes of a 32-assignment chunk holding the same expert, the leader (lowest such lane)
    writing the chunk's count, one thread per expert turning its column into exclusive prefixes,
    and the rank as the chunk's prefix plus the same-expert lanes below."""
    count = len(ids)
    chunks = -(-count // 32)
    sid = [e if 0 <= e < num_experts else -1 for e in ids]
    tab = [[0] * num_experts for _ in range(chunks)]
    warps = [
        [sid[i] if i < count else -1 for i in range(w0, w0 + 32)]
        for i0 in range(0, count, threads)
        for w0 in range(i0, i0 + threads, 32)
    ]
    for w, lanes in enumerate(warps):
        for lane, e in enumerate(lanes):
            same = [j for j, f in enumerate(lanes) if f == e]
            if e >= 0 and same[0] == lane:
                tab[w][e] = len(same)
    runs = []
    for e in range(num_experts):
        run = 0
        for c in range(chunks):
            tab[c][e], run = run, run + tab[c][e]
        runs.append(run)
    ends = [sum(runs[: e + 1]) for e in range(num_experts)]
    order = [-1] * count
    for w, lanes in enumerate(warps):
        for lane, e in enumerate(lanes):
            if e >= 0:
                rank = tab[w][e] + sum(1 for f in lanes[:lane] if f == e)
                order[(ends[e - 1] if e else 0) + rank] = 32 * w + lane
    return order[: ends[-1]], ends


@pytest.mark.parametrize("count,experts", [(1, 256), (37, 7), (512, 256), (700, 256), (96, 1)])
def test_the_table_form_replayed_on_the_cpu_is_a_stable_sort(count: int, experts: int) -> None:
    """The chunk-table ranks (the kernel's algorithm, not its code) give torch's stable order and
    the searchsorted ends, with a few hot experts and the thread count the launcher picks."""
    gen = torch.Generator().manual_seed(count * 1000 + experts)
    hot = torch.randint(0, experts, (max(1, experts // 16),), generator=gen)
    pick = torch.randint(0, experts, (count,), generator=gen)
    skew = torch.rand(count, generator=gen) < 0.5
    ids = torch.where(skew, hot[pick % hot.numel()], pick)
    threads = min(routing_cuda.SORT_THREADS, -(-max(count, experts) // 32) * 32)
    order, ends = _table_sort(ids.tolist(), experts, threads)
    want_order, want_ends = expert_ref.expert_groups(ids, experts)
    assert ends == want_ends.tolist()
    assert order == want_order.tolist()


def test_the_table_form_skips_ids_outside_the_experts() -> None:
    order, ends = _table_sort([2, 9, 1, -1, 2], 4, 32)
    assert ends == [0, 1, 3, 3] and order == [2, 0, 4]


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,top_k,experts", [(1, 8, 256), (17, 8, 256), (64, 8, 256),
                                                  (96, 8, 256), (256, 8, 256), (5, 3, 7),
                                                  (300, 4, 1024)])  # fmt: skip
@pytest.mark.parametrize("form", ["table", "count"])
def test_equals_the_twin_bit_for_bit(
    tokens: int, top_k: int, experts: int, form: str, gen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stable: the same order and ends as torch's stable sort and searchsorted, skewed choices
    (a few hot experts chosen by many tokens) included; the chunk table (where it fits)
    and the O(A^2) count alike."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if form == "table":
        monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    else:
        monkeypatch.setenv("NINFER_KERNELS_OFF", routing_cuda.SORT_TABLE)
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
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    for table in (True, False):
        monkeypatch.setattr(routing_cuda, "SORT_TABLE_SMEM", 48 * 1024 if table else 0)
        order, ends = routing_cuda.expert_sort(bad, 4)
        assert ends.tolist() == [0, 1, 3, 3] and order[:3].tolist() == [2, 0, 4]
