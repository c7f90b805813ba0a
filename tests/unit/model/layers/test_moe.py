"""MoE routing and fused experts vs a per-token loop; the block vs transformers' MoE block."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from ninfer.model.layers import moe
from ninfer.model.layers.mlp import swiglu_mlp
from ninfer.model.layers.moe import ExpertPath, MoeWeights, moe_experts, route_topk, sparse_moe

E, H, INTER = 6, 16, 8


def expert_naive(x, gate_up, down):
    gate, up = gate_up[:INTER], gate_up[INTER:]
    return down @ (F.silu(gate @ x) * (up @ x))


def test_route_topk_by_definition():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, 0.0, 0.0, 4.0]])
    weights, ids = route_topk(logits, 2, normalize=False)
    probs = logits.softmax(-1)
    assert ids.tolist() == [[3, 2], [0, 3]]
    torch.testing.assert_close(weights, torch.stack([probs[0, [3, 2]], probs[1, [0, 3]]]))
    normed, _ = route_topk(logits, 2, normalize=True)
    torch.testing.assert_close(normed.sum(-1), torch.ones(2))
    torch.testing.assert_close(normed[0], probs[0, [3, 2]] / probs[0, [3, 2]].sum())


@pytest.mark.parametrize("num_tokens", [11, 200], ids=["gathered", "grouped"])
def test_moe_experts_matches_per_token_loop(num_tokens):
    assert (num_tokens * 3 <= moe.GATHER_MAX_ASSIGNMENTS) == (num_tokens == 11)
    gen = torch.Generator().manual_seed(num_tokens)
    x = torch.randn(num_tokens, H, generator=gen)
    gate_up = torch.randn(E, 2 * INTER, H, generator=gen) / 4
    down = torch.randn(E, H, INTER, generator=gen) / 3
    weights, ids = route_topk(torch.randn(num_tokens, E, generator=gen), 3, normalize=True)
    got = moe_experts(x, gate_up, down, weights, ids)
    expected = torch.stack(
        [
            sum(
                weights[t, j] * expert_naive(x[t], gate_up[ids[t, j]], down[ids[t, j]])
                for j in range(3)
            )
            for t in range(num_tokens)
        ]
    )
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def cpu_grouped_mm_works() -> bool:
    """torch._grouped_mm runs on the CPU (its looped fallback) in recent torch releases."""
    try:
        torch._grouped_mm(torch.ones(2, 8), torch.ones(1, 8, 8), offs=torch.tensor([2]).int())
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_expert_path_choice_on_cpu(dtype):
    """Decode-sized batches gather; larger ones on the CPU loop (no sync-free grouped GEMM)."""
    x = torch.zeros(3, H, dtype=dtype)
    gate_up = torch.zeros(E, 2 * INTER, H, dtype=dtype)
    down = torch.zeros(E, H, INTER, dtype=dtype)
    limit = moe.GATHER_MAX_ASSIGNMENTS
    assert moe.expert_path(x, gate_up, down, 1) is ExpertPath.GATHERED
    assert moe.expert_path(x, gate_up, down, limit) is ExpertPath.GATHERED
    assert moe.expert_path(x, gate_up, down, limit + 1) is ExpertPath.LOOP


@pytest.mark.parametrize("with_shared", [False, True], ids=["routed", "with-shared"])
@pytest.mark.parametrize("path", list(ExpertPath), ids=lambda p: p.value)
def test_every_expert_path_matches_a_dense_per_token_reference(path, with_shared):
    if path is ExpertPath.GROUPED_MM and not cpu_grouped_mm_works():
        pytest.skip("this torch has no CPU torch._grouped_mm")
    num_tokens, top_k = 37, 3
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(num_tokens, H, generator=gen)
    gate_up = torch.randn(E, 2 * INTER, H, generator=gen) / 4
    down = torch.randn(E, H, INTER, generator=gen) / 3
    logits = torch.randn(num_tokens, E, generator=gen)
    logits[:, 5] = -30.0  # an expert no token picks: an empty group
    weights, ids = route_topk(logits, top_k, normalize=True)
    shared = torch.randn(num_tokens, H, generator=gen) if with_shared else None
    gate = torch.randn(num_tokens, 1, generator=gen) if with_shared else None
    got = moe_experts(x, gate_up, down, weights, ids, shared=shared, shared_gate=gate, path=path)
    expected = torch.stack(
        [
            sum(
                weights[t, j] * expert_naive(x[t], gate_up[ids[t, j]], down[ids[t, j]])
                for j in range(top_k)
            )
            for t in range(num_tokens)
        ]
    )
    if with_shared:
        expected = expected + torch.sigmoid(gate) * shared
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_grouped_mm_path_in_bf16_on_cpu():
    """bf16 is the dtype the GPU runs this path in; the bf16 result tracks fp32 within rounding."""
    if not cpu_grouped_mm_works():
        pytest.skip("this torch has no CPU torch._grouped_mm")
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(90, H, generator=gen)
    gate_up = torch.randn(E, 2 * INTER, H, generator=gen) / 4
    down = torch.randn(E, H, INTER, generator=gen) / 3
    weights, ids = route_topk(torch.randn(90, E, generator=gen), 2, normalize=False)
    want = moe_experts(x, gate_up, down, weights, ids, path=ExpertPath.LOOP)
    got = moe_experts(
        x.bfloat16(), gate_up.bfloat16(), down.bfloat16(), weights, ids, path=ExpertPath.GROUPED_MM
    )
    assert got.dtype == torch.bfloat16
    assert ((got.float() - want).norm() / want.norm()).item() < 2e-2


def test_swiglu_mlp_matches_transformers():
    transformers = pytest.importorskip("transformers")
    hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    config = transformers.Qwen3_5TextConfig(vocab_size=8, hidden_size=H, num_hidden_layers=1)
    module = hf.Qwen3_5MLP(config, intermediate_size=INTER)
    x = torch.randn(5, H)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5)
        expected = module(x)
    got = swiglu_mlp(x, module.gate_proj.weight, module.up_proj.weight, module.down_proj.weight)
    torch.testing.assert_close(got, expected)


def test_sparse_moe_matches_transformers_block():
    transformers = pytest.importorskip("transformers")
    hf = pytest.importorskip("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe")
    config = transformers.Qwen3_5MoeTextConfig(
        vocab_size=8,
        hidden_size=H,
        num_hidden_layers=1,
        num_experts=E,
        num_experts_per_tok=2,
        moe_intermediate_size=INTER,
        shared_expert_intermediate_size=12,
    )
    torch.manual_seed(3)
    block = hf.Qwen3_5MoeSparseMoeBlock(config).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5)
    x = torch.randn(1, 13, H)
    with torch.no_grad():
        expected = block(x)[0]
    w = MoeWeights(
        router=block.gate.weight.detach(),
        experts_gate_up=block.experts.gate_up_proj.detach(),
        experts_down=block.experts.down_proj.detach(),
        shared_gate_proj=block.shared_expert.gate_proj.weight.detach(),
        shared_up_proj=block.shared_expert.up_proj.weight.detach(),
        shared_down_proj=block.shared_expert.down_proj.weight.detach(),
        shared_gate=block.shared_expert_gate.weight.detach(),
    )
    got = sparse_moe(x[0], w, top_k=2, norm_topk_prob=True)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # the router and the shared gate as one [E + 1, H] GEMV give the same block
    fused = dataclasses.replace(w, router_and_gate=torch.cat([w.router, w.shared_gate]))
    got_fused = sparse_moe(x[0], fused, top_k=2, norm_topk_prob=True)
    torch.testing.assert_close(got_fused, expected, rtol=1e-5, atol=1e-5)


# --- the shared expert inside the gathered kernels ----------------------------------------------


def moe_weights(
    dtype: torch.dtype = torch.float32, *, shared_inter: int = INTER, bind: bool = True
) -> MoeWeights:
    """Random weights; `bind` puts the shared gate and up in one [2 Is, H] matrix (as the model
    does on CUDA), the two projections then views into it."""
    gen = torch.Generator().manual_seed(shared_inter)

    def draw(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).to(dtype)

    shared_gate_up = draw(2 * shared_inter, H)
    return MoeWeights(
        router=draw(E, H),
        experts_gate_up=draw(E, 2 * INTER, H),
        experts_down=draw(E, H, INTER),
        shared_gate_proj=shared_gate_up[:shared_inter],
        shared_up_proj=shared_gate_up[shared_inter:],
        shared_down_proj=draw(H, shared_inter),
        shared_gate=draw(1, H),
        shared_gate_up=shared_gate_up if bind else None,
    )


class SharedRecorder:
    """Records the `shared_weight` each `dispatch.expert_gemv` call gets and counts `mlp` calls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.shared_weights: list[torch.Tensor | None] = []
        self.mlp_calls = 0
        real_gemv, real_mlp = moe.dispatch.expert_gemv, moe.mlp

        def gemv(*args, **kwargs):
            self.shared_weights.append(kwargs.get("shared_weight"))
            return real_gemv(*args, **kwargs)

        def mlp(*args, **kwargs):
            self.mlp_calls += 1
            return real_mlp(*args, **kwargs)

        monkeypatch.setattr(moe.dispatch, "expert_gemv", gemv)
        monkeypatch.setattr(moe, "mlp", mlp)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_tokens", [1, 2, 8])
def test_sparse_moe_runs_the_shared_expert_in_the_gathered_kernels(dtype, num_tokens, monkeypatch):
    """Where it fits, no separate `mlp`: the shared gate-up rides in the expert GEMV; the block
    gives the same bits as the separate form (the twins run the same ops)."""
    w = moe_weights(dtype)
    assert moe.shared_expert_in_kernels(w) == (w.shared_gate_up, w.shared_down_proj)
    x = (torch.randn(num_tokens, H, generator=torch.Generator().manual_seed(num_tokens))).to(dtype)
    with monkeypatch.context() as m:
        calls = SharedRecorder(m)
        fused = sparse_moe(x, w, top_k=3, norm_topk_prob=True)
        assert calls.mlp_calls == 0
        assert [s is w.shared_gate_up for s in calls.shared_weights] == [True]
    with monkeypatch.context() as m:
        m.setenv("NINFER_KERNELS_OFF", "shared_expert_in_kernels")  # the separate form (A/B)
        calls = SharedRecorder(m)
        separate = sparse_moe(x, w, top_k=3, norm_topk_prob=True)
        assert calls.mlp_calls == 1 and calls.shared_weights == [None]
    assert torch.equal(fused, separate)


def test_sparse_moe_keeps_the_separate_shared_expert_where_it_does_not_fit(monkeypatch) -> None:
    """Gate and up not bound as one matrix, another intermediate size, fp8 weights, another
    dtype, or a batch past the gather limit (the loop on the CPU): the shared `mlp` runs."""
    w = moe_weights()
    fp8_down = Fp8Weight(w.shared_down_proj.to(torch.float8_e4m3fn), torch.ones(1, 1))
    unfit = {
        "unbound": moe_weights(bind=False),
        "other-size": moe_weights(shared_inter=12),
        "fp8-down": dataclasses.replace(w, shared_down_proj=fp8_down),
        "other-dtype": dataclasses.replace(w, shared_down_proj=w.shared_down_proj.double()),
    }
    for name, unfit_w in unfit.items():
        assert moe.shared_expert_in_kernels(unfit_w) is None, name
    x = torch.randn(2, H)
    for name in ("unbound", "other-size"):
        with monkeypatch.context() as m:
            calls = SharedRecorder(m)
            sparse_moe(x, unfit[name], top_k=3, norm_topk_prob=True)
            assert calls.mlp_calls == 1 and calls.shared_weights == [None], name
    many = torch.randn(moe.GATHER_MAX_ASSIGNMENTS // 3 + 1, H)  # past the gather limit at top-3
    with monkeypatch.context() as m:
        calls = SharedRecorder(m)
        sparse_moe(many, w, top_k=3, norm_topk_prob=True)
        assert calls.mlp_calls == 1 and calls.shared_weights == []


@pytest.mark.parametrize("path", list(ExpertPath), ids=lambda p: p.value)
def test_moe_experts_takes_the_shared_weights_on_every_path(path) -> None:
    """`shared_expert=` equals the precomputed `shared=` on every path (outside the gathered
    one it is computed first, as `mlp` would)."""
    if path is ExpertPath.GROUPED_MM and not cpu_grouped_mm_works():
        pytest.skip("this torch has no CPU torch._grouped_mm")
    w = moe_weights()
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(9, H, generator=gen)
    weights, ids = route_topk(torch.randn(9, E, generator=gen), 3, normalize=True)
    gate = torch.randn(9, 1, generator=gen)
    sgu, sdown = moe.shared_expert_in_kernels(w)
    shared = F.linear(F.silu(F.linear(x, sgu)[:, :INTER]) * F.linear(x, sgu)[:, INTER:], sdown)
    args = (x, w.experts_gate_up, w.experts_down, weights, ids)
    got = moe_experts(*args, shared_expert=(sgu, sdown), shared_gate=gate, path=path)
    want = moe_experts(*args, shared=shared, shared_gate=gate, path=path)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="not both"):
        moe_experts(*args, shared=shared, shared_expert=(sgu, sdown), shared_gate=gate)
