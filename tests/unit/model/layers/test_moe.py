"""MoE routing and fused experts vs a per-token loop; the block vs transformers' MoE block."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ninfer.model.layers import moe
from ninfer.model.layers.mlp import swiglu_mlp
from ninfer.model.layers.moe import MoeWeights, moe_experts, route_topk, sparse_moe

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
