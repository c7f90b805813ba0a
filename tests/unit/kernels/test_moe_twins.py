"""MoE twins on the CPU: routing and the fused decode tail against independent float64 references.

The routing reference is plain Python (math.exp, sorted by (-logit, id)), so the twin's
tie-breaking -- lowest expert id among equal logits -- is checked, not assumed. The decode-tail
reference is a per-token loop in float64.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch
from ninfer.kernels.expert_gemv import launch as expert_launch
from ninfer.kernels.expert_gemv.reference import expert_down_sum
from ninfer.kernels.moe_routing import launch as routing_launch
from ninfer.kernels.moe_routing.reference import route_topk


def routing_by_hand(logits: torch.Tensor, top_k: int, normalize: bool):
    """(weights, ids) as nested lists: softmax in float64, ties to the lower expert id."""
    all_weights, all_ids = [], []
    for row in logits.float().tolist():
        top = max(row)
        exps = [math.exp(v - top) for v in row]
        total = sum(exps)
        ids = sorted(range(len(row)), key=lambda e: (-row[e], e))[:top_k]
        weights = [exps[e] / total for e in ids]
        if normalize:
            kept = sum(weights)
            weights = [w / kept for w in weights]
        all_weights.append(weights)
        all_ids.append(ids)
    return all_weights, all_ids


def check_routing(logits: torch.Tensor, top_k: int, normalize: bool) -> None:
    weights, ids = route_topk(logits, top_k, normalize=normalize)
    want_weights, want_ids = routing_by_hand(logits, top_k, normalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64
    assert weights.is_contiguous() and ids.is_contiguous()
    assert ids.tolist() == want_ids
    torch.testing.assert_close(weights, torch.tensor(want_weights), rtol=0, atol=1e-6)


@pytest.mark.parametrize("normalize", [True, False], ids=["renorm", "plain"])
@pytest.mark.parametrize("num_experts,top_k", [(8, 2), (16, 1), (64, 8), (256, 8), (5, 5)])
def test_routing_twin_matches_softmax_topk_by_hand(num_experts, top_k, normalize) -> None:
    g = torch.Generator().manual_seed(num_experts * 10 + top_k)
    logits = torch.randn(6, num_experts, generator=g) * 2
    check_routing(logits, top_k, normalize)


@pytest.mark.parametrize("num_experts", [8, 256])
def test_routing_ties_go_to_the_lower_expert_id(num_experts: int) -> None:
    """bf16 router logits tie often; integer logits in [-2, 2] make ties certain."""
    g = torch.Generator().manual_seed(num_experts)
    logits = torch.randint(-2, 3, (9, num_experts), generator=g).to(torch.bfloat16)
    logits[0] = 1.0  # all equal: the choice must be experts 0..k-1 in order
    check_routing(logits, 4, normalize=True)
    assert route_topk(logits, 4, normalize=False)[1][0].tolist() == [0, 1, 2, 3]


def test_routing_reads_a_strided_view() -> None:
    """The router logits as a column slice of a fused [T, E + 1] (router + shared gate) GEMV."""
    g = torch.Generator().manual_seed(3)
    both = torch.randn(5, 17, generator=g)
    check_routing(both[:, :16], 3, normalize=True)


def test_dispatch_routes_with_the_twin_on_cpu() -> None:
    logits = torch.randn(4, 16)
    got = dispatch.route_topk(logits, 2, normalize=True)
    want = route_topk(logits, 2, normalize=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_routing_instance_and_support_rules() -> None:
    """One template instance per power of two of logits per lane; limits of the kernel."""
    assert [routing_launch.values_per_lane(e) for e in (1, 8, 32, 33, 64, 256, 257, 1024)] == [
        1,
        1,
        1,
        2,
        2,
        8,
        16,
        32,
    ]
    logits = torch.zeros(3, 256)
    assert routing_launch.supports(logits, 8)
    assert routing_launch.supports(logits.bfloat16(), 32)
    assert not routing_launch.supports(logits, 33)  # lane r keeps choice r
    assert not routing_launch.supports(torch.zeros(3, 1025), 8)
    assert not routing_launch.supports(torch.zeros(3, 4), 5)  # k > E
    assert not routing_launch.supports(logits.half(), 8)
    assert not routing_launch.supports(torch.zeros(256, 3).t(), 8)  # columns not dense


def down_sum_by_hand(gate_up_out, down, ids, weights, shared=None, shared_gate=None):
    """Per-token float64 loop over the k chosen experts."""
    num_tokens, top_k = ids.shape
    inter = down.shape[2]
    out = []
    for t in range(num_tokens):
        acc = torch.zeros(down.shape[1], dtype=torch.float64)
        for j in range(top_k):
            row = gate_up_out[t * top_k + j].double()
            h = F.silu(row[:inter]) * row[inter:]
            acc += weights[t, j].double() * (down[ids[t, j]].double() @ h)
        if shared is not None:
            acc += torch.sigmoid(shared_gate[t, 0].double()) * shared[t].double()
        out.append(acc)
    return torch.stack(out)


@pytest.mark.parametrize("with_shared", [False, True], ids=["routed", "with-shared"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_tokens,top_k", [(1, 8), (3, 3), (4, 1)])
def test_expert_down_sum_twin_matches_per_token_loop(num_tokens, top_k, dtype, with_shared):
    g = torch.Generator().manual_seed(num_tokens * 100 + top_k)
    num_experts, hidden, inter = 10, 24, 16
    gate_up_out = torch.randn(num_tokens * top_k, 2 * inter, generator=g).to(dtype)
    down = (torch.randn(num_experts, hidden, inter, generator=g) / 4).to(dtype)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(num_tokens)])
    weights = torch.rand(num_tokens, top_k, generator=g)
    shared = torch.randn(num_tokens, hidden, generator=g).to(dtype) if with_shared else None
    gate = torch.randn(num_tokens, 1, generator=g).to(dtype) if with_shared else None
    got = expert_down_sum(gate_up_out, down, ids, weights, shared=shared, shared_gate=gate)
    want = down_sum_by_hand(gate_up_out, down, ids, weights, shared, gate)
    assert got.dtype == dtype and got.shape == (num_tokens, hidden)
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    else:  # bf16 rounds h, each expert's output and the combine steps
        assert ((got.double() - want).norm() / want.norm()).item() < 2e-2
    via_dispatch = dispatch.expert_down_sum(
        gate_up_out, down, ids, weights, shared=shared, shared_gate=gate
    )
    assert torch.equal(via_dispatch, got)


def test_expert_down_sum_support_rules() -> None:
    down = torch.zeros(4, 40, 24)
    gate_up_out = torch.zeros(6, 48)
    ids = torch.zeros(2, 3, dtype=torch.int64)
    shared, gate = torch.zeros(2, 40), torch.zeros(2, 1)
    assert expert_launch.supports_down_sum(gate_up_out, down, ids)
    assert expert_launch.supports_down_sum(gate_up_out, down, ids, shared, gate)
    assert not expert_launch.supports_down_sum(gate_up_out, down, ids, shared, None)
    assert not expert_launch.supports_down_sum(gate_up_out.bfloat16(), down, ids)  # dtypes mix
    assert not expert_launch.supports_down_sum(torch.zeros(6, 44), torch.zeros(4, 40, 22), ids)
    assert not expert_launch.supports_down_sum(gate_up_out[:, :47], down, ids)  # width != 2I
    wide = torch.zeros(6, 50)[:, :48]  # rows 200 bytes apart: not 16-byte aligned
    assert not expert_launch.supports_down_sum(wide, down, ids)
    assert not expert_launch.supports_down_sum(
        torch.zeros(66, 48), down, torch.zeros(2, 33, dtype=torch.int64)
    )  # k > 32
    assert expert_launch.rows_per_warp(512) == 8 and expert_launch.rows_per_warp(2048) == 4
