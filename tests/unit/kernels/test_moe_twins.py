"""MoE twins on the CPU: routing and the fused decode tail against independent float64 references.

The routing reference is plain Python (math.exp, sorted by (-logit, id)), so the twin's
tie-breaking -- lowest expert id among equal logits -- is checked, not assumed. The decode-tail
reference is a per-token loop in float64. The shared expert run inside the gathered kernels
(`shared_weight`, `shared_down`) is checked against the separate form it replaces (the shared
`mlp`, then the decode tail with its output): the same ops, so the same bits in both dtypes.
The launch geometry of both kernels is checked with the CUDA runtime mocked out.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch
from ninfer.kernels import runtime as rt
from ninfer.kernels.expert_gemv import launch as expert_launch
from ninfer.kernels.expert_gemv.reference import expert_down_sum, expert_gemv
from ninfer.kernels.moe_routing import launch as routing_launch
from ninfer.kernels.moe_routing.reference import route_topk
from ninfer.kernels.silu_mul.reference import silu_mul


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


def test_routing_keys_rule(monkeypatch) -> None:
    """bf16 logits choose by packed keys unless `routing_keys` is switched off; fp32 never."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    assert routing_launch.chooses_by_keys(torch.zeros(2, 256, dtype=torch.bfloat16))
    assert not routing_launch.chooses_by_keys(torch.zeros(2, 256))
    monkeypatch.setenv("NINFER_KERNELS_OFF", "routing_keys")
    assert not routing_launch.chooses_by_keys(torch.zeros(2, 256, dtype=torch.bfloat16))


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


# --- the shared expert inside the gathered kernels ----------------------------------------------


def moe_operands(num_tokens, top_k, num_experts, hidden, inter, dtype, seed):
    """x, experts' gate-up and down, ids, weights, gate logits, the shared gate-up and down."""
    g = torch.Generator().manual_seed(seed)

    def draw(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * scale).to(dtype)

    x = draw(num_tokens, hidden)
    gate_up = draw(num_experts, 2 * inter, hidden, scale=hidden**-0.5)
    down = draw(num_experts, hidden, inter, scale=inter**-0.5)
    ids = torch.stack([torch.randperm(num_experts, generator=g)[:top_k] for _ in range(num_tokens)])
    weights = torch.rand(num_tokens, top_k, generator=g)
    gate = draw(num_tokens, 1)
    shared_gate_up = draw(2 * inter, hidden, scale=hidden**-0.5)
    shared_down = draw(hidden, inter, scale=inter**-0.5)
    return x, gate_up, down, ids, weights, gate, shared_gate_up, shared_down


SHAPES = [
    (1, 8, 32, 64, 16),
    (2, 8, 32, 64, 16),
    (8, 8, 64, 48, 8),
    (3, 2, 6, 16, 8),
    (5, 1, 4, 24, 16),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_tokens,top_k,num_experts,hidden,inter", SHAPES)
def test_shared_expert_in_kernels_equals_the_separate_mlp(
    num_tokens, top_k, num_experts, hidden, inter, dtype
) -> None:
    """Fused form (shared gate-up as each token's last gate-up row, its down in the tail) against
    today's composition: `mlp` (F.linear, silu_mul, F.linear), then the tail with its output.
    The twins run the same ops on the same values, so equal bits in fp32 and in bf16."""
    x, gate_up, down, ids, weights, gate, sgu, sdown = moe_operands(
        num_tokens, top_k, num_experts, hidden, inter, dtype, seed=num_tokens * 31 + top_k
    )
    flat = ids.reshape(-1)
    shared = F.linear(silu_mul(F.linear(x, sgu)), sdown)  # `mlp` with gate_up bound
    separate = expert_down_sum(
        expert_gemv(x, gate_up, flat, rows_per_input=top_k),
        down,
        ids,
        weights,
        shared=shared,
        shared_gate=gate,
    )
    rows = expert_gemv(x, gate_up, flat, rows_per_input=top_k, shared_weight=sgu)
    assert rows.shape == (num_tokens * (top_k + 1), 2 * inter)
    fused = expert_down_sum(rows, down, ids, weights, shared_gate=gate, shared_down=sdown)
    assert fused.dtype == dtype and fused.shape == (num_tokens, hidden)
    assert torch.equal(fused, separate)
    # dispatch on CPU tensors: the twins, with the new arguments passed through
    rows_d = dispatch.expert_gemv(x, gate_up, flat, rows_per_input=top_k, shared_weight=sgu)
    fused_d = dispatch.expert_down_sum(
        rows_d, down, ids, weights, shared_gate=gate, shared_down=sdown
    )
    assert torch.equal(rows_d, rows) and torch.equal(fused_d, fused)
    # and against float64 by hand, as the routed-only tail above
    by_hand = down_sum_by_hand(
        rows.view(num_tokens, top_k + 1, -1)[:, :top_k].reshape(num_tokens * top_k, -1),
        down,
        ids,
        weights,
        shared.double(),
        gate,
    )
    if dtype == torch.float32:
        torch.testing.assert_close(fused.double(), by_hand, rtol=1e-5, atol=1e-5)
    else:
        assert ((fused.double() - by_hand).norm() / by_hand.norm()).item() < 2e-2


def test_expert_gemv_twin_puts_the_shared_row_last_per_token() -> None:
    """Row t (k + 1) + j is routed choice j of token t, row t (k + 1) + k is the shared expert."""
    x, gate_up, _, ids, _, _, sgu, _ = moe_operands(3, 2, 6, 16, 8, torch.float32, seed=5)
    flat = ids.reshape(-1)
    rows = expert_gemv(x, gate_up, flat, rows_per_input=2, shared_weight=sgu).view(3, 3, -1)
    routed = expert_gemv(x, gate_up, flat, rows_per_input=2).view(3, 2, -1)
    assert torch.equal(rows[:, :2], routed)
    torch.testing.assert_close(rows[:, 2], x @ sgu.T)


def test_expert_down_sum_twin_rejects_mixed_shared_forms() -> None:
    x, gate_up, down, ids, weights, gate, sgu, sdown = moe_operands(
        2, 2, 6, 16, 8, torch.float32, seed=6
    )
    rows = expert_gemv(x, gate_up, ids.reshape(-1), rows_per_input=2, shared_weight=sgu)
    with pytest.raises(ValueError, match="shared_down"):
        expert_down_sum(rows, down, ids, weights, shared_down=sdown)  # no gate logits
    with pytest.raises(ValueError, match="shared_down"):
        expert_down_sum(rows, down, ids, weights, shared=x, shared_gate=gate, shared_down=sdown)


def test_shared_expert_support_rules() -> None:
    experts_gate_up, experts_down = torch.zeros(4, 48, 40), torch.zeros(4, 40, 24)
    x = torch.zeros(2, 40)
    sgu, sdown = torch.zeros(48, 40), torch.zeros(40, 24)
    assert expert_launch.supports(x, experts_gate_up, sgu)
    assert not expert_launch.supports(x, experts_gate_up, torch.zeros(40, 40))  # not an expert
    assert not expert_launch.supports(x, experts_gate_up, sgu.bfloat16())
    assert not expert_launch.supports(x, experts_gate_up, torch.zeros(40, 48).t())  # strided
    # x is staged 16 bytes at a time: rows must start on 16-byte boundaries
    assert not expert_launch.supports(torch.zeros(2, 41)[:, 1:], experts_gate_up)
    assert expert_launch.supports(torch.zeros(1, 41)[:, :40], experts_gate_up)
    assert not expert_launch.supports(torch.zeros(2, 41)[:, :40], experts_gate_up)
    ids, gate = torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 1)
    rows = torch.zeros(8, 48)  # 2 tokens x (3 + 1) gate-up rows
    assert expert_launch.supports_down_sum(rows, experts_down, ids, None, gate, sdown)
    assert not expert_launch.supports_down_sum(rows, experts_down, ids, None, None, sdown)
    assert not expert_launch.supports_down_sum(rows[:6], experts_down, ids, None, gate, sdown)
    assert not expert_launch.supports_down_sum(
        rows, experts_down, ids, torch.zeros(2, 40), gate, sdown
    )  # a shared output and shared_down
    assert not expert_launch.supports_down_sum(
        rows, experts_down, ids, None, gate, torch.zeros(40, 16)
    )
    # the shared slot counts against the 32 units of the block's partials
    wide_ids = torch.zeros(1, 31, dtype=torch.int64)
    assert expert_launch.supports_down_sum(
        torch.zeros(32, 48), experts_down, wide_ids, None, gate[:1], sdown
    )
    assert not expert_launch.supports_down_sum(
        torch.zeros(33, 48),
        experts_down,
        torch.zeros(1, 32, dtype=torch.int64),
        None,
        gate[:1],
        sdown,
    )


def test_down_sum_block_gives_every_unit_a_warp() -> None:
    """(row groups, threads): routed-only k <= 8 keep the former 8 warps; k = 8 plus the shared
    slot gets 9 warps instead of one warp running two units; at most 16 warps."""
    block = expert_launch.down_sum_block
    assert block(8, False) == (1, 256)
    assert block(8, True) == (1, 288)
    assert block(3, False) == (2, 256)
    assert block(2, True) == (2, 256)
    assert block(1, False) == (8, 256)
    assert block(10, False) == (1, 320)
    assert block(32, False) == (1, 512)
    assert block(31, True) == (1, 512)


class Launches:
    """Records (instance, grid, block, args) of launches, with the CUDA runtime mocked out."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[dict[str, Any]] = []
        monkeypatch.setattr(rt, "check_cuda", lambda *t: torch.device("cpu"))
        monkeypatch.setattr(rt, "get_kernel", lambda op, instance, device: instance)
        monkeypatch.setattr(rt, "launch", self.launch)

    def launch(self, kernel, grid, block, args, device, *, shared_mem: int = 0) -> None:
        self.calls.append(
            {"instance": kernel, "grid": grid, "block": block, "args": args, "smem": shared_mem}
        )


@pytest.mark.parametrize("with_shared", [False, True], ids=["routed", "with-shared"])
@pytest.mark.parametrize("unroll", [None, 1, 2])
def test_expert_gemv_launch_at_35b_shapes(with_shared, unroll, monkeypatch) -> None:
    """2 tokens x top-8 of [1024, 2048] experts: 32 row tiles of 8 warps x 4 rows, one grid row
    per assignment (the shared one included); the shared matrix is the kernel's 6th argument."""
    launches = Launches(monkeypatch)
    x = torch.zeros(2, 2048, dtype=torch.bfloat16)
    experts = torch.zeros(3, 1024, 2048, dtype=torch.bfloat16)
    sgu = torch.zeros(1024, 2048, dtype=torch.bfloat16) if with_shared else None
    ids = torch.zeros(16, dtype=torch.int64)
    out = expert_launch.expert_gemv(
        x, experts, ids, rows_per_input=8, shared_weight=sgu, unroll=unroll
    )
    assert out.shape == (18 if with_shared else 16, 1024)
    (call,) = launches.calls
    want_unroll = expert_launch.GEMV_UNROLL if unroll is None else unroll
    assert call["instance"] == f"expert_gemv<bf16, 4, {want_unroll}>"
    assert call["grid"] == (32, 18 if with_shared else 16) and call["block"] == (256,)
    assert call["smem"] == 4 * 2048
    assert call["args"][5] == rt.ptr(sgu) and call["args"][6] == 8
    with pytest.raises(rt.KernelInputError, match="unroll"):
        expert_launch.expert_gemv(x, experts, ids, rows_per_input=8, unroll=3)


@pytest.mark.parametrize("with_shared", [False, True], ids=["routed", "with-shared"])
def test_expert_down_sum_launch_at_35b_shapes(with_shared, monkeypatch) -> None:
    """2 tokens x top-8 of [2048, 512] down matrices: 256 row tiles of 8 rows per token; with the
    shared expert 9 warps (one per slot) and the gate-up rows 9 per token."""
    launches = Launches(monkeypatch)
    slots = 9 if with_shared else 8
    rows = torch.zeros(2 * slots, 1024, dtype=torch.bfloat16)
    down = torch.zeros(3, 2048, 512, dtype=torch.bfloat16)
    ids = torch.zeros(2, 8, dtype=torch.int64)
    gate = torch.zeros(2, 1, dtype=torch.bfloat16)
    sdown = torch.zeros(2048, 512, dtype=torch.bfloat16) if with_shared else None
    shared = None if with_shared else torch.zeros(2, 2048, dtype=torch.bfloat16)
    out = expert_launch.expert_down_sum(
        rows, down, ids, torch.zeros(2, 8), shared=shared, shared_gate=gate, shared_down=sdown
    )
    assert out.shape == (2, 2048)
    (call,) = launches.calls
    assert call["instance"] == "expert_down_sum<bf16, 8>"
    assert call["grid"] == (256, 2) and call["block"] == (288 if with_shared else 256,)
    args = call["args"]
    assert args[2] == 1024  # gate-up row stride
    assert args[6] == rt.ptr(shared) and args[10] == rt.ptr(sdown)
    assert args[11:] == (8, 1, 2048, 512)  # top_k, groups, n, k
