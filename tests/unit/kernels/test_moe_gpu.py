"""MoE on the GPU: the routing and decode-tail kernels against their twins, the whole decode MoE
(kernels) against the twins at 35B-A3B shapes, the grouped prefill path against the expert loop,
and `sparse_moe` replayed from a CUDA graph against eager (GPU only, fresh random inputs each run).
The shared expert run inside the gathered kernels (`shared_weight`, `shared_down`) is checked the
same way: each kernel against its twin, the block against the twins and against the separate
shared `mlp` on the GPU.

Tolerances as test_kernels_gpu.py: bf16 outputs within 1e-2 relative (norm of the difference over
the norm of the reference), fp32 within 1e-4; routing ids equal and weights within 1e-6. Where
only the load schedule differs (expert_gemv's UNROLL, expert_group_mma's depth) the results are
compared for equal bits. The tensor-core grouped GEMV is checked against the twin and against the
CUDA-core kernel, with hot experts chosen by more rows than one pass takes.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch
from ninfer.kernels.expert_gemv import launch as expert_cuda
from ninfer.kernels.expert_gemv import reference as expert_ref
from ninfer.kernels.moe_routing import launch as routing_cuda
from ninfer.kernels.moe_routing import reference as routing_ref
from ninfer.model.layers import moe
from ninfer.model.layers.moe import ExpertPath, MoeWeights
from support.gpu_checks import rel

pytestmark = pytest.mark.gpu
TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-4}
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
# 35B-A3B: hidden 2048, 256 experts, top-8, expert and shared-expert intermediate 512
HIDDEN, EXPERTS, TOP_K, INTER, SHARED_INTER = 2048, 256, 8, 512, 512


def fresh_generator() -> torch.Generator:
    return torch.Generator("cuda").manual_seed(torch.seed() % 2**31)


@pytest.fixture
def gen() -> torch.Generator:
    return fresh_generator()


def make_moe(
    gen: torch.Generator,
    dtype: torch.dtype,
    *,
    num_experts: int,
    hidden: int,
    inter: int,
    shared_inter: int,
) -> MoeWeights:
    """Random MoE weights at scales that keep activations O(1) and the router decisive."""

    def draw(*shape: int, fan_in: int, scale: float = 1.0) -> torch.Tensor:
        w = torch.randn(shape, device="cuda", generator=gen) * (scale / fan_in**0.5)
        return w.to(dtype)

    return MoeWeights(
        router=draw(num_experts, hidden, fan_in=hidden, scale=2.0),
        experts_gate_up=draw(num_experts, 2 * inter, hidden, fan_in=hidden),
        experts_down=draw(num_experts, hidden, inter, fan_in=inter),
        shared_gate_proj=draw(shared_inter, hidden, fan_in=hidden),
        shared_up_proj=draw(shared_inter, hidden, fan_in=hidden),
        shared_down_proj=draw(hidden, shared_inter, fan_in=shared_inter),
        shared_gate=draw(1, hidden, fan_in=hidden),
    )


@pytest.fixture(scope="module")
def big_moe() -> MoeWeights:
    """One 35B-A3B MoE layer in bf16 (1.5 GiB of experts), shared by the tests of this module."""
    return make_moe(
        fresh_generator(),
        torch.bfloat16,
        num_experts=EXPERTS,
        hidden=HIDDEN,
        inter=INTER,
        shared_inter=SHARED_INTER,
    )


def with_fused_router(w: MoeWeights) -> MoeWeights:
    """The router and the shared gate as one [E + 1, H] matrix (strided logits downstream)."""
    return dataclasses.replace(w, router_and_gate=torch.cat([w.router, w.shared_gate]))


def with_shared_gate_up(w: MoeWeights) -> MoeWeights:
    """The shared gate and up bound as one [2 Is, H] matrix, as the model binds them on CUDA:
    where Is equals the experts' intermediate size the gathered kernels run the shared expert."""
    fused = torch.cat([w.shared_gate_proj, w.shared_up_proj])
    gate, up = fused.split(w.shared_gate_proj.shape[0])
    return dataclasses.replace(w, shared_gate_proj=gate, shared_up_proj=up, shared_gate_up=fused)


# --- routing kernel ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("normalize", [True, False], ids=["renorm", "plain"])
@pytest.mark.parametrize(
    "tokens,num_experts,top_k",
    [
        (1, 256, 8),
        (8, 256, 8),
        (2048, 256, 8),
        (7, 8, 2),
        (5, 16, 4),
        (33, 64, 8),
        (3, 100, 7),
        (4, 1000, 32),
        (6, 8, 8),
        (2, 1, 1),
    ],
)
def test_moe_routing(dtype, normalize: bool, tokens: int, num_experts: int, top_k: int, gen):
    logits = (torch.randn(tokens, num_experts, device="cuda", generator=gen) * 2).to(dtype)
    assert routing_cuda.supports(logits, top_k)
    weights, ids = routing_cuda.route_topk(logits, top_k, normalize=normalize)
    want_weights, want_ids = routing_ref.route_topk(logits, top_k, normalize=normalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64
    assert weights.shape == ids.shape == (tokens, top_k)
    assert torch.equal(ids, want_ids)
    assert (weights - want_weights).abs().max().item() <= 1e-6


@pytest.mark.parametrize("num_experts,top_k", [(256, 8), (8, 3), (64, 32)])
def test_moe_routing_ties_and_strided_logits(num_experts: int, top_k: int, gen) -> None:
    """Integer bf16 logits tie everywhere (lowest id wins); rows of a [T, E + 1] GEMV output."""
    both = torch.randint(-2, 3, (64, num_experts + 1), device="cuda", generator=gen)
    both = both.to(torch.bfloat16)
    both[0] = 1.0  # one row all equal: experts 0..k-1
    logits = both[:, :num_experts]
    weights, ids = routing_cuda.route_topk(logits, top_k, normalize=True)
    want_weights, want_ids = routing_ref.route_topk(logits, top_k, normalize=True)
    assert torch.equal(ids, want_ids)
    assert ids[0].tolist() == list(range(top_k))
    assert (weights - want_weights).abs().max().item() <= 1e-6


@pytest.mark.parametrize("num_experts,top_k", [(256, 8), (1000, 32), (33, 32), (8, 8), (64, 5)])
def test_moe_routing_bf16_keys_choose_as_the_butterfly(
    num_experts: int, top_k: int, gen, monkeypatch
):
    """bf16 rows choose by packed (logit, id) keys and a warp max, fp32 rows (and bf16 rows with
    `routing_keys` off) by the butterfly: on the same values (bf16 is exact in fp32) the two give
    the same ids and the same weight bits. Rows of negatives (the key's flipped half), signed
    zeros (equal: the lower id first), -inf, the bf16 extremes and denormals, and heavy ties; and
    the twin's ids."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    rows = torch.randn(48, num_experts, device="cuda", generator=gen) * 3
    rows[0] = -rows[0].abs() - 1  # all negative
    rows[1] = 0.0
    rows[1, 1::2] = -0.0  # +0 and -0 alternating: one tie
    rows[2, : num_experts // 2] = float("-inf")
    rows[2, -1] = float("-inf")
    rows[3, :4] = torch.tensor([3.3895e38, -3.3895e38, 9.2e-41, -9.2e-41])[: min(4, num_experts)]
    rows[4:8] = rows[4:8].round().clamp(-2, 2)  # ties everywhere
    rows[8] = -0.0
    logits = rows.to(torch.bfloat16)
    assert torch.signbit(logits[1, 1]) and not torch.signbit(logits[1, 0])
    for normalize in (False, True):
        weights, ids = routing_cuda.route_topk(logits, top_k, normalize=normalize)
        weights32, ids32 = routing_cuda.route_topk(logits.float(), top_k, normalize=normalize)
        assert torch.equal(ids, ids32)
        assert torch.equal(weights.view(torch.int32), weights32.view(torch.int32))
        _, want_ids = routing_ref.route_topk(logits, top_k, normalize=normalize)
        assert torch.equal(ids, want_ids)
        monkeypatch.setenv("NINFER_KERNELS_OFF", "routing_keys")
        weights_b, ids_b = routing_cuda.route_topk(logits, top_k, normalize=normalize)
        monkeypatch.delenv("NINFER_KERNELS_OFF")
        assert torch.equal(ids, ids_b) and torch.equal(weights, weights_b)
    assert ids[1].tolist() == list(range(top_k)) and ids[8].tolist() == list(range(top_k))


# --- fused decode tail --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_shared", [False, True], ids=["routed", "with-shared"])
@pytest.mark.parametrize(
    "tokens,num_experts,top_k,hidden,inter",
    [
        (1, EXPERTS, TOP_K, HIDDEN, INTER),
        (4, EXPERTS, TOP_K, HIDDEN, INTER),
        (8, EXPERTS, TOP_K, HIDDEN, INTER),
        (3, 6, 3, 40, 24),
        (2, 16, 1, 48, 16),
        (2, 16, 10, 44, 24),
        (5, 32, 32, 64, 8),
    ],
    ids=["35b-t1", "35b-t4", "35b-t8", "tiny-k3", "tiny-k1", "tiny-k10", "tiny-k32"],
)
def test_expert_down_sum(dtype, with_shared, tokens, num_experts, top_k, hidden, inter, gen):
    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, device="cuda", generator=gen) * scale).to(dtype)

    gate_up_out = randn(tokens * top_k, 2 * inter)
    down = randn(num_experts, hidden, inter, scale=inter**-0.5)
    scores = torch.rand(tokens, num_experts, device="cuda", generator=gen)
    ids = scores.argsort(dim=-1)[:, :top_k]  # distinct experts per token
    weights = torch.rand(tokens, top_k, device="cuda", generator=gen)
    shared = randn(tokens, hidden) if with_shared else None
    # the gate logit as a column of a wider GEMV output, read in place
    gate = randn(tokens, 5)[:, 2:3] if with_shared else None
    assert expert_cuda.supports_down_sum(gate_up_out, down, ids, shared, gate)
    got = expert_cuda.expert_down_sum(
        gate_up_out, down, ids, weights, shared=shared, shared_gate=gate
    )
    want = expert_ref.expert_down_sum(
        gate_up_out, down, ids, weights, shared=shared, shared_gate=gate
    )
    assert got.shape == want.shape == (tokens, hidden) and got.dtype == dtype
    assert rel(got, want) < TOL[dtype]


# --- the shared expert inside the gathered kernels ----------------------------------------------

SHARED_CASES = pytest.mark.parametrize(
    "tokens,num_experts,top_k,hidden,inter",
    [
        (1, EXPERTS, TOP_K, HIDDEN, INTER),
        (2, EXPERTS, TOP_K, HIDDEN, INTER),
        (8, EXPERTS, TOP_K, HIDDEN, INTER),
        (3, 6, 3, 40, 24),
        (2, 16, 1, 48, 16),
        (2, 16, 2, 64, 32),
        (5, 32, 31, 64, 8),
    ],
    ids=["35b-t1", "35b-t2", "35b-t8", "tiny-k3", "tiny-k1", "tiny-k2", "tiny-k31"],
)


def shared_operands(gen, dtype, tokens, num_experts, top_k, hidden, inter):
    """x, experts [E, 2I, H] and [E, H, I], ids (distinct per token), weights, gate logits (a
    column of a wider GEMV output), the shared gate-up [2I, H] and down [H, I]."""

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, device="cuda", generator=gen) * scale).to(dtype)

    x = randn(tokens, hidden)
    gate_up = randn(num_experts, 2 * inter, hidden, scale=hidden**-0.5)
    down = randn(num_experts, hidden, inter, scale=inter**-0.5)
    scores = torch.rand(tokens, num_experts, device="cuda", generator=gen)
    ids = scores.argsort(dim=-1)[:, :top_k]
    weights = torch.rand(tokens, top_k, device="cuda", generator=gen)
    gate = randn(tokens, 5)[:, 2:3]
    shared_gate_up = randn(2 * inter, hidden, scale=hidden**-0.5)
    shared_down = randn(hidden, inter, scale=inter**-0.5)
    return x, gate_up, down, ids, weights, gate, shared_gate_up, shared_down


@pytest.mark.parametrize("dtype", DTYPES)
@SHARED_CASES
def test_expert_gemv_with_shared_weight(dtype, tokens, num_experts, top_k, hidden, inter, gen):
    """Each unroll against the twin; the unrolls and the routed rows without the shared matrix
    give equal bits (each lane accumulates its chunks in the same order)."""
    x, gate_up, _, ids, _, _, sgu, _ = shared_operands(
        gen, dtype, tokens, num_experts, top_k, hidden, inter
    )
    flat = ids.reshape(-1)
    assert expert_cuda.supports(x, gate_up, sgu)
    want = expert_ref.expert_gemv(x, gate_up, flat, rows_per_input=top_k, shared_weight=sgu)
    routed = expert_cuda.expert_gemv(x, gate_up, flat, rows_per_input=top_k)
    got = {}
    for unroll in expert_cuda.GEMV_UNROLLS:
        got[unroll] = expert_cuda.expert_gemv(
            x, gate_up, flat, rows_per_input=top_k, shared_weight=sgu, unroll=unroll
        )
        assert got[unroll].shape == want.shape == (tokens * (top_k + 1), 2 * inter)
        assert rel(got[unroll], want) < TOL[dtype]
        # the shared rows alone: a relative error over the routed rows could hide them
        assert rel(got[unroll].view(tokens, top_k + 1, -1)[:, top_k], F.linear(x, sgu)) < TOL[dtype]
    assert torch.equal(got[1], got[2])
    assert torch.equal(got[1].view(tokens, top_k + 1, -1)[:, :top_k].reshape(-1, 2 * inter), routed)


@pytest.mark.parametrize("dtype", DTYPES)
@SHARED_CASES
def test_expert_down_sum_with_shared_down(dtype, tokens, num_experts, top_k, hidden, inter, gen):
    """The tail with the shared expert's gate-up row per token against the twin, and against the
    kernel given the shared output precomputed from the same row (the separate form)."""
    _, _, down, ids, weights, gate, _, sdown = shared_operands(
        gen, dtype, tokens, num_experts, top_k, hidden, inter
    )
    rows = (torch.randn(tokens * (top_k + 1), 2 * inter, device="cuda", generator=gen)).to(dtype)
    assert expert_cuda.supports_down_sum(rows, down, ids, None, gate, sdown)
    got = expert_cuda.expert_down_sum(rows, down, ids, weights, shared_gate=gate, shared_down=sdown)
    want = expert_ref.expert_down_sum(rows, down, ids, weights, shared_gate=gate, shared_down=sdown)
    assert got.shape == want.shape == (tokens, hidden) and got.dtype == dtype
    assert rel(got, want) < TOL[dtype]
    per_token = rows.view(tokens, top_k + 1, -1)
    gate_rows, up_rows = per_token[:, top_k].chunk(2, dim=-1)
    shared = F.linear(F.silu(gate_rows) * up_rows, sdown)
    separate = expert_cuda.expert_down_sum(
        per_token[:, :top_k].reshape(tokens * top_k, -1),
        down,
        ids,
        weights,
        shared=shared,
        shared_gate=gate,
    )
    assert rel(got, separate) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inter", [8, 24, 264])  # 1, 3 and 33 chunks of 16 bytes (bf16)
def test_expert_down_sum_rows_of_few_or_odd_chunks(dtype, inter, gen):
    """Rows whose chunk count is below or at an odd distance from the 32 lanes of a warp."""
    tokens, num_experts, top_k, hidden = 3, 12, 4, 64
    rows = torch.randn(tokens * top_k, 2 * inter, device="cuda", generator=gen).to(dtype)
    down = (torch.randn(num_experts, hidden, inter, device="cuda", generator=gen) * 0.1).to(dtype)
    ids = torch.rand(tokens, num_experts, device="cuda", generator=gen).argsort(-1)[:, :top_k]
    weights = torch.rand(tokens, top_k, device="cuda", generator=gen)
    got = expert_cuda.expert_down_sum(rows, down, ids, weights)
    assert rel(got, expert_ref.expert_down_sum(rows, down, ids, weights)) < TOL[dtype]


@pytest.mark.parametrize("tokens", [1, 2, 8])
def test_decode_moe_with_the_shared_expert_in_kernels_at_35b_shapes(
    tokens, big_moe, gen, monkeypatch
):
    """sparse_moe with the shared gate-up bound (Is = I = 512): the gathered kernels run the
    shared expert; against the twins, and against the kernels with the separate shared mlp."""
    w = with_shared_gate_up(big_moe)
    assert moe.shared_expert_in_kernels(w) is not None
    x = tie_free_x(tokens, w.router, gen)
    got = moe.sparse_moe(x, w, top_k=TOP_K, norm_topk_prob=True)
    with monkeypatch.context() as m:
        m.setattr(moe, "shared_expert_in_kernels", lambda _: None)
        separate = moe.sparse_moe(x, w, top_k=TOP_K, norm_topk_prob=True)
    with monkeypatch.context() as m:
        m.setenv("NINFER_KERNELS", "torch")
        want = moe.sparse_moe(x, w, top_k=TOP_K, norm_topk_prob=True)
    assert got.shape == (tokens, HIDDEN) and got.dtype == torch.bfloat16
    assert rel(got, want) < TOL[torch.bfloat16]
    assert rel(got, separate) < TOL[torch.bfloat16]


def tie_free_x(tokens: int, router: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """bf16 decode rows that route the same way through any bf16 router GEMM: rows whose k-th
    and (k+1)-th exact logits lie within two bf16 ulps are drawn again. The kernels' router GEMM
    and the twin's (cuBLAS) may round such logits apart, so the two would pick different experts
    (random 256-expert routers give such ties in a few % of rows; run S34B saw one fail the
    comparison with the twins)."""
    x = torch.randn(tokens, router.shape[1], device="cuda", generator=gen).to(torch.bfloat16)
    for _ in range(100):
        top = (x.double() @ router.double().T).topk(TOP_K + 1, dim=-1).values
        ulp = torch.exp2(torch.floor(torch.log2(top[:, TOP_K - 1].abs().clamp(min=2**-30))) - 7)
        tied = (top[:, TOP_K - 1] - top[:, TOP_K] <= 2 * ulp).nonzero().flatten()
        if tied.numel() == 0:
            return x
        fresh = torch.randn(tied.numel(), x.shape[1], device="cuda", generator=gen)
        x[tied] = fresh.to(torch.bfloat16)
    raise AssertionError("no tie-free rows in 100 draws")


# --- the whole MoE block ------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", [1, 4, 8])
def test_decode_moe_kernels_match_twins_at_35b_shapes(tokens, big_moe, gen, monkeypatch):
    x = tie_free_x(tokens, big_moe.router, gen)
    logits = F.linear(x, big_moe.router)
    assert dispatch.use_cuda_kernels(x, "moe_routing") and routing_cuda.supports(logits, TOP_K)
    assert moe.expert_path(x, big_moe.experts_gate_up, big_moe.experts_down, tokens * TOP_K) is (
        ExpertPath.GATHERED
    )
    for w in (big_moe, with_fused_router(big_moe)):
        got = moe.sparse_moe(x, w, top_k=TOP_K, norm_topk_prob=True)
        with monkeypatch.context() as m:
            m.setenv("NINFER_KERNELS", "torch")
            want = moe.sparse_moe(x, w, top_k=TOP_K, norm_topk_prob=True)
        assert got.shape == (tokens, HIDDEN) and got.dtype == torch.bfloat16
        assert rel(got, want) < TOL[torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 3])
@pytest.mark.parametrize("shared_inter", [48, 32], ids=["shared-mlp", "shared-in-kernels"])
def test_tiny_moe_kernels_match_twins(dtype, tokens: int, shared_inter: int, gen, monkeypatch):
    """The tiny test models' MoE shape (hidden 64, 16 experts, top-2) in fp32 and bf16; with a
    shared expert of the experts' size (the tiny models' own) it runs inside the kernels."""
    w = make_moe(gen, dtype, num_experts=16, hidden=64, inter=32, shared_inter=shared_inter)
    w = with_shared_gate_up(w)
    assert (moe.shared_expert_in_kernels(w) is not None) == (shared_inter == 32)
    x = torch.randn(tokens, 64, device="cuda", generator=gen).to(dtype)
    got = moe.sparse_moe(x, w, top_k=2, norm_topk_prob=False)
    monkeypatch.setenv("NINFER_KERNELS", "torch")
    want = moe.sparse_moe(x, w, top_k=2, norm_topk_prob=False)
    assert rel(got, want) < TOL[dtype]


def test_expert_path_choice_on_cuda() -> None:
    """Above the gather limit the grouped GEMV (16-byte rows), above its limit the grouped GEMM
    for bf16 (H200 is sm_90); fp32 there, or odd widths anywhere: the loop."""
    assert torch.cuda.get_device_capability()[0] in (9, 10), "these checks assume sm_90/sm_100"
    many = moe.GATHER_MAX_ASSIGNMENTS + 1
    most = moe.GROUP_GEMV_MAX_ASSIGNMENTS + 1

    def path(dtype: torch.dtype, n: int, hidden: int = 64, inter: int = 16) -> ExpertPath:
        x = torch.zeros(4, hidden, device="cuda", dtype=dtype)
        gate_up = torch.zeros(4, 2 * inter, hidden, device="cuda", dtype=dtype)
        down = torch.zeros(4, hidden, inter, device="cuda", dtype=dtype)
        return moe.expert_path(x, gate_up, down, n)

    assert path(torch.bfloat16, moe.GROUP_GEMV_MIN_ASSIGNMENTS - 1) is ExpertPath.GATHERED
    assert path(torch.bfloat16, moe.GROUP_GEMV_MIN_ASSIGNMENTS) is ExpertPath.GROUPED_GEMV
    assert path(torch.bfloat16, many) is ExpertPath.GROUPED_GEMV
    assert path(torch.float32, many) is ExpertPath.GROUPED_GEMV
    assert path(torch.bfloat16, most) is ExpertPath.GROUPED_MM
    assert path(torch.float32, most) is ExpertPath.LOOP
    assert path(torch.bfloat16, many, hidden=60) is ExpertPath.LOOP
    assert path(torch.bfloat16, many, inter=12) is ExpertPath.LOOP


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("swiglu", [False, True], ids=["plain", "swiglu-input"])
@pytest.mark.parametrize("skew", [False, True], ids=["spread", "one-hot-expert"])
@pytest.mark.parametrize("tensor_cores", [True, False], ids=["mma", "fma"])
def test_expert_group_gemv_matches_twin(dtype, swiglu: bool, skew: bool, tensor_cores, gen) -> None:
    """Empty experts, groups of 1..MAXM and (skewed) groups longer than one staged pass; bf16
    runs the tensor-core kernel unless `tensor_cores` is off (fp32 always the CUDA-core one)."""
    experts, n, k, tokens, top_k = 16, 96, 256, 24, 3
    width = 2 * k if swiglu else k
    rows_per_input = 1 if swiglu else top_k
    inputs = tokens * top_k // rows_per_input
    x = torch.randn(inputs, width, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(experts, n, k, device="cuda", generator=gen) / k**0.5).to(dtype)
    ids = torch.randint(0, experts - 4, (tokens * top_k,), device="cuda", generator=gen)
    if skew:
        ids[: 2 * expert_cuda.GROUP_MAX_INPUTS + 1] = 3  # one expert over three passes
    assert expert_cuda.supports_group(x, w, swiglu_input=swiglu)
    assert expert_cuda.uses_group_mma(x, w) == (dtype == torch.bfloat16)
    got = expert_cuda.expert_group_gemv(
        x, w, ids, rows_per_input=rows_per_input, swiglu_input=swiglu, tensor_cores=tensor_cores
    )
    want = expert_ref.expert_group_gemv(
        x, w, ids, rows_per_input=rows_per_input, swiglu_input=swiglu
    )
    assert got.shape == want.shape == (tokens * top_k, n) and got.dtype == dtype
    assert rel(got, want) < TOL[dtype]


def skewed_ids(gen: torch.Generator, tokens: int) -> tuple[torch.Tensor, dict[int, int]]:
    """[tokens, TOP_K] distinct experts per token (tokens >= 17), random except three hot
    experts: 5 chosen by the first min(20, tokens) (> 16: two passes even with two n-tiles), 7 by
    the last 12 (> 8: two n-tiles, or two passes with one) and 9 by the first 9. Returns the ids
    and {expert: rows choosing it}."""
    hot = {5: (0, min(20, tokens)), 7: (tokens - 12, tokens), 9: (0, 9)}
    scores = torch.rand(tokens, EXPERTS, device="cuda", generator=gen)
    for expert, (lo, hi) in hot.items():
        scores[lo:hi, expert] += 2.0  # above every random score: always in the top k
    ids = scores.topk(TOP_K, dim=-1).indices
    counts = {e: int((ids == e).sum()) for e in hot}
    assert counts[5] > 16 and counts[7] >= 12 and counts[9] >= 9
    return ids, counts


def group_operands(
    big_moe: MoeWeights, gen: torch.Generator, tokens: int, swiglu: bool
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(x, experts, inputs per assignment) of one 35B grouped GEMV: the gate-up of `tokens`
    hidden rows (top-8 each), or the down projection of SwiGLU'd gate-up rows (one each)."""
    if swiglu:
        x = torch.randn(tokens * TOP_K, 2 * INTER, device="cuda", generator=gen)
        return x.to(torch.bfloat16), big_moe.experts_down, 1
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen)
    return x.to(torch.bfloat16), big_moe.experts_gate_up, TOP_K


@pytest.mark.parametrize("tokens", [17, 64, 96])
@pytest.mark.parametrize("swiglu", [False, True], ids=["gate-up", "down-swiglu"])
def test_expert_group_mma_at_35b_shapes(
    tokens: int, swiglu: bool, big_moe, gen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tensor-core grouped GEMV against the twin and the CUDA-core kernel (bf16 outputs:
    within 1e-2 relative), the hot experts' rows also on their own (a relative error over all rows
    could hide them); both load depths, and two n-tiles per pass for the gate-up
    (`group_mma_wide` on), give equal bits (same step order)."""
    ids, _ = skewed_ids(gen, tokens)
    flat = ids.reshape(-1)
    x, w, per_input = group_operands(big_moe, gen, tokens, swiglu)
    assert expert_cuda.uses_group_mma(x, w)
    kw = {"rows_per_input": per_input, "swiglu_input": swiglu}
    groups = expert_ref.expert_groups(flat, EXPERTS)
    got = {
        d: expert_cuda.expert_group_gemv(x, w, flat, groups=groups, depth=d, **kw)
        for d in expert_cuda.GROUP_MMA_DEPTHS
    }
    mma = got[expert_cuda.GROUP_MMA_DEPTH]
    fma = expert_cuda.expert_group_gemv(x, w, flat, groups=groups, tensor_cores=False, **kw)
    want = expert_ref.expert_group_gemv(x, w, flat, **kw)
    assert mma.shape == want.shape == (tokens * TOP_K, w.shape[1])
    assert rel(mma, want) < TOL[torch.bfloat16]
    assert rel(mma, fma) < TOL[torch.bfloat16]
    for expert in (5, 7, 9):
        rows = flat == expert
        assert rel(mma[rows], want[rows]) < TOL[torch.bfloat16], expert
    first, *others = got.values()
    assert all(torch.equal(first, other) for other in others)
    monkeypatch.setenv("NINFER_KERNELS_ON", "group_mma_wide")
    assert expert_cuda.group_mma_tiles(w.shape[2]) == 2
    wide = expert_cuda.expert_group_gemv(x, w, flat, groups=groups, **kw)
    assert torch.equal(wide, mma)


def test_expert_group_mma_switch_and_odd_shapes(gen, monkeypatch) -> None:
    """dispatch runs the mma kernel, and the CUDA-core one with `expert_group_mma` in
    NINFER_KERNELS_OFF (equal bits to the launcher's two choices); N off the 16-row tiles and K
    off the 32-wide steps (K % 8 == 0 only) against the twin."""
    for experts, n, k, tokens in ((5, 40, 72, 9), (3, 24, 8, 6), (4, 200, 1000, 11)):
        x = torch.randn(tokens, k, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(experts, n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16)
        ids = torch.randint(0, experts, (tokens * 2,), device="cuda", generator=gen)
        ids[:17] = 1  # one expert over two passes (17 > 16: both n-tiles, then one input)
        want = expert_ref.expert_group_gemv(x, w, ids, rows_per_input=2)
        mma = expert_cuda.expert_group_gemv(x, w, ids, rows_per_input=2)
        fma = expert_cuda.expert_group_gemv(x, w, ids, rows_per_input=2, tensor_cores=False)
        assert rel(mma, want) < TOL[torch.bfloat16], (n, k)
        monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
        assert torch.equal(dispatch.expert_group_gemv(x, w, ids, rows_per_input=2), mma)
        monkeypatch.setenv("NINFER_KERNELS_OFF", "expert_group_mma")
        assert torch.equal(dispatch.expert_group_gemv(x, w, ids, rows_per_input=2), fma)


@pytest.mark.parametrize("tokens", [17, 64])
@pytest.mark.parametrize("swiglu", [False, True], ids=["gate-up", "down-swiglu"])
def test_expert_group_mma_cp_ring_gives_the_register_rings_bits(
    tokens: int, swiglu: bool, big_moe, gen, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CP form (dispatch's default: the weight ring in shared memory, filled by cp.async) runs
    the same mma in the same order as the register ring (`NINFER_KERNELS_OFF=group_mma_cp`): equal
    bits at the 35B shapes with hot experts (several passes a block), in eager launches and
    replayed in a graph with new inputs."""
    ids, _ = skewed_ids(gen, tokens)
    flat = ids.reshape(-1)
    x, w, per_input = group_operands(big_moe, gen, tokens, swiglu)
    kw = {"rows_per_input": per_input, "swiglu_input": swiglu}
    groups = expert_ref.expert_groups(flat, EXPERTS)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "group_mma_cp")
    want = expert_cuda.expert_group_gemv(x, w, flat, groups=groups, **kw)
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    assert torch.equal(expert_cuda.expert_group_gemv(x, w, flat, groups=groups, **kw), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = expert_cuda.expert_group_gemv(x, w, flat, groups=groups, **kw)
    x.copy_(torch.randn(x.shape, device="cuda", generator=gen).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    monkeypatch.setenv("NINFER_KERNELS_OFF", "group_mma_cp")
    assert torch.equal(out, expert_cuda.expert_group_gemv(x, w, flat, groups=groups, **kw))


def test_expert_group_mma_cp_ring_odd_shapes(gen, monkeypatch) -> None:
    """The CP form with N off the 16-row tiles, K off the 32-wide steps and shorter than
    the ring (K = 8, 72: fewer steps than stages) and an expert over two passes: the register
    ring's bits."""
    for experts, n, k, tokens in ((5, 40, 72, 9), (3, 24, 8, 6), (4, 200, 1000, 11)):
        x = torch.randn(tokens, k, device="cuda", generator=gen).to(torch.bfloat16)
        w = (torch.randn(experts, n, k, device="cuda", generator=gen) / k**0.5).to(torch.bfloat16)
        ids = torch.randint(0, experts, (tokens * 2,), device="cuda", generator=gen)
        ids[:17] = 1
        monkeypatch.setenv("NINFER_KERNELS_OFF", "group_mma_cp")
        want = expert_cuda.expert_group_gemv(x, w, ids, rows_per_input=2)
        monkeypatch.delenv("NINFER_KERNELS_OFF")
        assert torch.equal(expert_cuda.expert_group_gemv(x, w, ids, rows_per_input=2), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_shared", [False, True], ids=["routed", "with-shared"])
def test_moe_combine_matches_twin(dtype, with_shared: bool, gen) -> None:
    tokens, top_k, hidden = 37, 8, 2048
    y = torch.randn(tokens * top_k, hidden, device="cuda", generator=gen).to(dtype)
    weights = torch.rand(tokens, top_k, device="cuda", generator=gen)
    shared = torch.randn(tokens, hidden, device="cuda", generator=gen).to(dtype)
    gate = torch.randn(tokens, 5, device="cuda", generator=gen).to(dtype)[:, 1:2]
    kw = {"shared": shared, "shared_gate": gate} if with_shared else {}
    assert expert_cuda.supports_combine(y, weights, *kw.values())
    got = expert_cuda.moe_combine(y, weights, **kw)
    want = expert_ref.moe_combine(y, weights, **kw)
    assert got.shape == want.shape == (tokens, hidden) and got.dtype == dtype
    assert rel(got, want) < TOL[dtype]


@pytest.mark.parametrize("top_k", [1, 8, 16, 17])
@pytest.mark.parametrize("with_shared", [False, True], ids=["routed", "with-shared"])
def test_moe_combine_loads_first_gives_the_loops_bits(
    top_k: int, with_shared: bool, gen, monkeypatch
) -> None:
    """The loads-first form (k <= 16) against the loop it replaces: the same adds in the same
    order, so the same bits; k = 17 takes the loop in both."""
    tokens, hidden = 64, 2048 + 96  # a partial last block of rows
    y = torch.randn(tokens * top_k, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    weights = torch.rand(tokens, top_k, device="cuda", generator=gen)
    shared = torch.randn(tokens, hidden, device="cuda", generator=gen).to(torch.bfloat16)
    gate = torch.randn(tokens, 3, device="cuda", generator=gen).to(torch.bfloat16)[:, 2:3]
    kw = {"shared": shared, "shared_gate": gate} if with_shared else {}
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    first = expert_cuda.moe_combine(y, weights, **kw)
    monkeypatch.setenv("NINFER_KERNELS_OFF", expert_cuda.COMBINE_PRELOAD)
    loop = expert_cuda.moe_combine(y, weights, **kw)
    assert torch.equal(first, loop)
    assert rel(first, expert_ref.moe_combine(y, weights, **kw)) < TOL[torch.bfloat16]


@pytest.mark.parametrize("tokens", [17, 64, 96])
@pytest.mark.parametrize("kernel", ["mma", "fma"])
@pytest.mark.parametrize("skew", [False, True], ids=["routed", "skewed"])
def test_grouped_gemv_decode_matches_the_loop_and_never_syncs(
    tokens: int, kernel: str, skew: bool, big_moe, gen, monkeypatch
) -> None:
    """The 35B-A3B decode MoE at 17..96 rows (136..768 assignments), against the expert loop,
    with the tensor-core grouped GEMV or (`expert_group_mma` switched off) the CUDA-core one;
    `skewed`: hot experts chosen by 9..20 rows (see skewed_ids)."""
    if kernel == "fma":
        monkeypatch.setenv("NINFER_KERNELS_OFF", "expert_group_mma")
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    weights, ids = dispatch.route_topk(F.linear(x, big_moe.router), TOP_K, normalize=True)
    if skew:
        ids, _ = skewed_ids(gen, tokens)
    gate_up, down = big_moe.experts_gate_up, big_moe.experts_down
    assert moe.expert_path(x, gate_up, down, ids.numel()) is ExpertPath.GROUPED_GEMV
    got = moe.moe_experts(x, gate_up, down, weights, ids, path=ExpertPath.GROUPED_GEMV)
    want = moe.moe_experts(x, gate_up, down, weights, ids, path=ExpertPath.LOOP)
    assert rel(got, want) < TOL[torch.bfloat16]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any device-to-host sync now raises
    try:
        again = moe.moe_experts(x, gate_up, down, weights, ids, path=ExpertPath.GROUPED_GEMV)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(again, got)


def test_grouped_prefill_matches_the_loop_and_never_syncs(big_moe, gen) -> None:
    tokens = 2048
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    weights, ids = dispatch.route_topk(F.linear(x, big_moe.router), TOP_K, normalize=True)
    gate_up, down = big_moe.experts_gate_up, big_moe.experts_down
    assert moe.expert_path(x, gate_up, down, ids.numel()) is ExpertPath.GROUPED_MM
    got = moe.moe_experts(x, gate_up, down, weights, ids, path=ExpertPath.GROUPED_MM)
    want = moe.moe_experts(x, gate_up, down, weights, ids, path=ExpertPath.LOOP)
    assert got.shape == (tokens, HIDDEN)
    assert rel(got, want) < TOL[torch.bfloat16]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any device-to-host sync now raises
    try:
        again = moe.moe_experts(x, gate_up, down, weights, ids, path=ExpertPath.GROUPED_MM)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(again, got)


@pytest.mark.parametrize("tokens", [1, 4, 64], ids=["t1", "t4", "t64-grouped"])
@pytest.mark.parametrize("fused_router", [False, True], ids=["router", "router+gate"])
@pytest.mark.parametrize("bound_shared", [False, True], ids=["shared-mlp", "shared-gate-up"])
def test_sparse_moe_replays_from_a_cuda_graph(
    tokens: int, fused_router: bool, bound_shared: bool, big_moe, gen
):
    """Capture once, replay on new inputs: the routing happens on the device each replay. With
    the shared gate-up bound the gathered steps (t1, t4) run the shared expert in the kernels."""
    w = with_fused_router(big_moe) if fused_router else big_moe
    w = with_shared_gate_up(w) if bound_shared else w
    static_x = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
    path = moe.expert_path(static_x, w.experts_gate_up, w.experts_down, tokens * TOP_K)
    assert path is (ExpertPath.GATHERED if tokens <= 4 else ExpertPath.GROUPED_GEMV)

    def step() -> torch.Tensor:
        return moe.sparse_moe(static_x, w, top_k=TOP_K, norm_topk_prob=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernel compilation, cuBLAS workspaces
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    for _ in range(2):
        fresh = torch.randn(tokens, HIDDEN, device="cuda", generator=gen).to(torch.bfloat16)
        static_x.copy_(fresh)
        graph.replay()
        eager = moe.sparse_moe(fresh, w, top_k=TOP_K, norm_topk_prob=True)
        torch.cuda.synchronize()
        assert rel(static_out, eager) < 1e-3
