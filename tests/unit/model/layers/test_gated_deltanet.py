"""Gated DeltaNet ops: chunked vs recurrent delta rule, HF's recurrent rule, conv state carry.

Inputs are fresh random tensors (fixed seeds); fp32 tolerance 1e-4 in max-abs relative error.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ninfer.model.batch import ForwardBatch
from ninfer.model.layers.gated_deltanet import (
    DeltaNetWeights,
    causal_conv1d,
    causal_conv1d_update,
    chunk_gated_delta_rule,
    gated_delta_rule_decode,
    gated_deltanet,
    recurrent_gated_delta_rule,
)
from ninfer.model.layers.norm import l2_norm

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")

HK, HV, DK, DV = 2, 4, 16, 8


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def rule_inputs(num_tokens: int, seed: int, heads=(HK, HV)):
    gen = torch.Generator().manual_seed(seed)
    hk, hv = heads
    q = l2_norm(torch.randn(num_tokens, hk, DK, generator=gen))
    k = l2_norm(torch.randn(num_tokens, hk, DK, generator=gen))
    v = torch.randn(num_tokens, hv, DV, generator=gen)
    # Decays from almost none to strong, as softplus-shaped gates produce.
    g = -F.softplus(torch.randn(num_tokens, hv, generator=gen) * 2 - 1)
    beta = torch.sigmoid(torch.randn(num_tokens, hv, generator=gen))
    state = torch.randn(hv, DK, DV, generator=gen)
    return q, k, v, g, beta, state


@pytest.mark.parametrize(
    ("num_tokens", "chunk_size"),
    [(1, 64), (5, 64), (64, 64), (65, 64), (130, 16), (37, 8)],
    ids=lambda x: str(x),
)
def test_chunked_matches_recurrent(num_tokens, chunk_size):
    q, k, v, g, beta, state = rule_inputs(num_tokens, seed=num_tokens)
    scale = DK**-0.5
    o_ref, s_ref = recurrent_gated_delta_rule(q, k, v, g, beta, state, scale=scale)
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, state, scale=scale, chunk_size=chunk_size)
    assert o.shape == (num_tokens, HV, DV) and s.shape == (HV, DK, DV)
    assert rel_err(o, o_ref) < 1e-4
    assert rel_err(s, s_ref) < 1e-4


def test_chunked_split_carries_state():
    q, k, v, g, beta, state = rule_inputs(100, seed=3)
    scale = DK**-0.5
    o_all, s_all = chunk_gated_delta_rule(q, k, v, g, beta, state, scale=scale)
    o1, s1 = chunk_gated_delta_rule(q[:41], k[:41], v[:41], g[:41], beta[:41], state, scale=scale)
    o2, s2 = chunk_gated_delta_rule(q[41:], k[41:], v[41:], g[41:], beta[41:], s1, scale=scale)
    assert rel_err(torch.cat([o1, o2]), o_all) < 1e-4
    assert rel_err(s2, s_all) < 1e-4


def test_recurrent_matches_transformers():
    q, k, v, g, beta, state = rule_inputs(20, seed=5)
    o, s = recurrent_gated_delta_rule(q, k, v, g, beta, state, scale=DK**-0.5)
    # Key heads expanded here: older transformers (5.17) expect the layer to have done it.
    q_v, k_v = (x.repeat_interleave(HV // HK, dim=1) for x in (q, k))
    o_hf, s_hf = hf.torch_recurrent_gated_delta_rule(
        q_v[None],
        k_v[None],
        v[None],
        g[None],
        beta[None],
        initial_state=state[None],
        output_final_state=True,
        use_qk_l2norm_in_kernel=False,
    )
    assert rel_err(o, o_hf[0]) < 1e-5
    assert rel_err(s, s_hf[0]) < 1e-5


def test_decode_step_updates_only_its_slots():
    gen = torch.Generator().manual_seed(8)
    num_slots, slots = 6, torch.tensor([4, 1, 3])
    ssm = torch.randn(num_slots, HV, DK, DV, generator=gen)
    before = ssm.clone()
    q, k, v, g, beta, _ = rule_inputs(3, seed=9)  # one token for each of 3 sequences
    out = gated_delta_rule_decode(q, k, v, g, beta, ssm, slots, scale=DK**-0.5)
    for b, slot in enumerate(slots.tolist()):
        o_ref, s_ref = recurrent_gated_delta_rule(
            q[b : b + 1],
            k[b : b + 1],
            v[b : b + 1],
            g[b : b + 1],
            beta[b : b + 1],
            before[slot],
            scale=DK**-0.5,
        )
        assert rel_err(out[b], o_ref[0]) < 1e-5
        assert rel_err(ssm[slot], s_ref) < 1e-5
    for slot in (0, 2, 5):
        assert torch.equal(ssm[slot], before[slot])


def test_causal_conv1d_from_zero_state_is_padded_conv():
    gen = torch.Generator().manual_seed(1)
    channels, kernel, num_tokens = 6, 4, 11
    x = torch.randn(num_tokens, channels, generator=gen)
    weight = torch.randn(channels, kernel, generator=gen)
    state = torch.zeros(2, channels, kernel - 1)
    got = causal_conv1d(x, weight, state, torch.tensor([1]), (num_tokens,))
    padded = F.conv1d(x.T[None], weight[:, None], padding=kernel - 1, groups=channels)
    expected = F.silu(padded[0, :, :num_tokens]).T
    assert rel_err(got, expected) < 1e-6
    assert torch.equal(state[1], x[-(kernel - 1) :].T)  # the last K-1 inputs
    assert torch.equal(state[0], torch.zeros(channels, kernel - 1))


def test_causal_conv1d_carry_and_update_match_one_shot():
    gen = torch.Generator().manual_seed(2)
    channels, kernel = 5, 4
    x = torch.randn(9, channels, generator=gen)
    weight = torch.randn(channels, kernel, generator=gen)
    one_state = torch.zeros(1, channels, kernel - 1)
    one = causal_conv1d(x, weight, one_state, torch.tensor([0]), (9,))
    # Two short pieces (shorter than K-1 first), then single-token updates.
    state = torch.zeros(3, channels, kernel - 1)
    slot = torch.tensor([2])
    parts = [causal_conv1d(x[:2], weight, state, slot, (2,))]
    parts.append(causal_conv1d(x[2:6], weight, state, slot, (4,)))
    parts += [causal_conv1d_update(x[t : t + 1], weight, state, slot) for t in range(6, 9)]
    assert rel_err(torch.cat(parts), one) < 1e-6
    assert torch.allclose(state[2], one_state[0])


def test_causal_conv1d_varlen_sequences_are_independent():
    gen = torch.Generator().manual_seed(4)
    channels, kernel = 5, 3
    weight = torch.randn(channels, kernel, generator=gen)
    xs = [torch.randn(n, channels, generator=gen) for n in (4, 1, 7)]
    init = torch.randn(4, channels, kernel - 1, generator=gen)
    slots = [3, 0, 2]
    state = init.clone()
    got = causal_conv1d(torch.cat(xs), weight, state, torch.tensor(slots), (4, 1, 7))
    start = 0
    for x, slot in zip(xs, slots, strict=True):
        solo_state = init.clone()
        solo = causal_conv1d(x, weight, solo_state, torch.tensor([slot]), (x.shape[0],))
        assert rel_err(got[start : start + x.shape[0]], solo) < 1e-6
        assert torch.equal(state[slot], solo_state[slot])
        start += x.shape[0]


def test_layer_matches_transformers_module():
    config = transformers.Qwen3_5TextConfig(
        vocab_size=32,
        hidden_size=48,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        linear_num_key_heads=HK,
        linear_num_value_heads=HV,
        linear_key_head_dim=DK,
        linear_value_head_dim=DV,
        linear_conv_kernel_dim=4,
        intermediate_size=32,
    )
    torch.manual_seed(0)
    module = hf.Qwen3_5GatedDeltaNet(config, layer_idx=0).eval()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name != "A_log":
                p.copy_(torch.randn(p.shape) / max(p.shape[-1], 1) ** 0.5 + (name == "norm.weight"))
    x = torch.randn(70, 48)
    with torch.no_grad():
        expected = module(x[None])[0]
    params = dict(module.named_parameters())
    weights = DeltaNetWeights(
        in_proj_qkv=params["in_proj_qkv.weight"].detach(),
        in_proj_z=params["in_proj_z.weight"].detach(),
        in_proj_b=params["in_proj_b.weight"].detach(),
        in_proj_a=params["in_proj_a.weight"].detach(),
        conv1d=params["conv1d.weight"].detach()[:, 0],
        dt_bias=params["dt_bias"].detach(),
        A_log=params["A_log"].detach(),
        norm=params["norm.weight"].detach(),
        out_proj=params["out_proj.weight"].detach(),
    )
    conv_dim = 2 * HK * DK + HV * DV
    conv_state = torch.zeros(2, conv_dim, 3)
    ssm_state = torch.zeros(2, HV, DK, DV)
    batch = ForwardBatch.prefill(
        torch.zeros(70, dtype=torch.int64), num_computed=0, page_ids=[0], state_slot=1
    )
    with torch.no_grad():
        got = gated_deltanet(
            x,
            weights,
            conv_state=conv_state,
            ssm_state=ssm_state,
            batch=batch,
            eps=config.rms_norm_eps,
        )
    assert rel_err(got, expected) < 1e-4
    assert ssm_state[1].abs().sum() > 0 and ssm_state[0].abs().sum() == 0
