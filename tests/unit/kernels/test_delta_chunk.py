"""The chunked gated-delta twin against the token-by-token definition, and the chunk launcher's
host-side rules (CPU).

The reference side is `recurrent_gated_delta_rule` in float64 on q/k normalised as
x / sqrt(sum x^2 + 1e-6), softplus as log1p(exp(.)) and sigmoid as 1 / (1 + exp(-.)), per
sequence from its slot's state. Tolerances (||a - b|| / ||b||): the exact chunked form
(`operand_dtype=None`) within 1e-4; the kernel's bf16 operand rounding within 1e-2 (it measures
2.5e-3 to 4e-3 on these inputs). Fresh random inputs per run; slots no sequence names are
NaN-poisoned and must come back untouched.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch, runtime
from ninfer.kernels.gated_delta_chunk import launch
from ninfer.kernels.gated_delta_chunk.reference import (
    CHUNK,
    chunk_terms,
    gated_delta_chunk_prefill,
)
from ninfer.model.layers.gated_deltanet import recurrent_gated_delta_rule
from support.gpu_checks import rel

EXACT_TOL = 1e-4
BF16_TOL = 1e-2


def _case(lens, hk, hv, dk, dv, dtype, *, start="random", decay="mild"):
    """Raw conv-output q/k/v (views of wide rows) and gate projections, fresh per call."""
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    num_tokens = sum(lens)
    width = 2 * hk * dk + hv * dv
    mixed = torch.randn(num_tokens, width + 8, generator=gen).to(dtype)
    q = mixed[:, : hk * dk].view(num_tokens, hk, dk)
    k = mixed[:, hk * dk : 2 * hk * dk].view(num_tokens, hk, dk)
    v = mixed[:, 2 * hk * dk : width].view(num_tokens, hv, dv)
    gates = torch.randn(num_tokens, 2 * hv + 3, generator=gen).to(dtype)
    a, b = gates[:, :hv], gates[:, hv : 2 * hv]
    a_log = torch.rand(hv, generator=gen) * 2 - 1 + (3.0 if decay == "strong" else 0.0)
    dt_bias = torch.randn(hv, generator=gen)
    num_slots = len(lens) + 2
    state = torch.randn(num_slots, hv, dk, dv, generator=gen) * 0.5
    if start == "zero":
        state.zero_()
    slots = torch.randperm(num_slots, generator=gen)[: len(lens)]
    unused = sorted(set(range(num_slots)) - set(slots.tolist()))
    state[unused] = float("nan")
    return (q, k, v, a, b, a_log, dt_bias), state, slots, unused


def _by_definition(inputs, state, slots, lens, scale):
    q, k, v, a, b, a_log, dt_bias = (t.double() for t in inputs)
    q = q / (q.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    k = k / (k.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    g = -a_log.exp() * torch.log1p((a + dt_bias).exp())
    beta = 1.0 / (1.0 + (-b).exp())
    outs, finals = [], []
    start = 0
    for i, n in enumerate(lens):
        span = slice(start, start + n)
        o, final = recurrent_gated_delta_rule(
            q[span], k[span], v[span], g[span], beta[span], state[int(slots[i])].double(),
            scale=scale,
        )  # fmt: skip
        outs.append(o)
        finals.append(final)
        start += n
    return torch.cat(outs), finals


# (lens, Hk, Hv, Dk, Dv): sequences that end on, just before and just after chunk edges,
# a one-token and an empty sequence, grouped value heads (Hv / Hk = 2, 3)
ALIGNMENTS = [
    pytest.param((1,), 1, 2, 64, 16, id="one-token"),
    pytest.param((63,), 2, 4, 64, 16, id="63"),
    pytest.param((64,), 2, 4, 64, 16, id="64"),
    pytest.param((65,), 2, 4, 64, 16, id="65"),
    pytest.param((1, 64, 65, 130, 3), 1, 3, 128, 16, id="mixed-edges"),
    pytest.param((0, 70), 2, 4, 64, 32, id="empty-sequence"),
    pytest.param((200,), 2, 4, 128, 16, id="200"),
]


@pytest.mark.parametrize("lens,hk,hv,dk,dv", ALIGNMENTS)
@pytest.mark.parametrize("start", ["random", "zero"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_exact_chunked_twin_matches_the_definition(lens, hk, hv, dk, dv, start, dtype) -> None:
    inputs, state, slots, unused = _case(lens, hk, hv, dk, dv, dtype, start=start)
    scale = dk**-0.5
    before = state.clone()
    got = gated_delta_chunk_prefill(*inputs, state, slots, lens, scale=scale, operand_dtype=None)
    want, finals = _by_definition(inputs, before, slots, lens, scale)
    assert got.shape == (sum(lens), hv, dv) and got.dtype == torch.float32
    if sum(lens):
        assert rel(got, want) < EXACT_TOL
    for i, final in enumerate(finals):
        if start == "random" or lens[i]:
            assert rel(state[int(slots[i])], final) < EXACT_TOL
        else:
            assert not state[int(slots[i])].any()  # an empty sequence leaves a zero state zero
    assert state[unused].isnan().all()


@pytest.mark.parametrize(
    "lens,hk,hv,dk,dv",
    [
        pytest.param((1, 64, 65, 130, 3), 1, 3, 128, 16, id="mixed-edges"),
        pytest.param((260,), 1, 2, 128, 32, id="260"),
    ],
)
@pytest.mark.parametrize("decay", ["mild", "strong"])
def test_bf16_operand_twin_within_its_bound(lens, hk, hv, dk, dv, decay) -> None:
    """The rounding the kernel does (bf16 operands, fp32 state and accumulation) stays bounded
    over many chunks; strong decays (e^g down to ~1e-20 a token) underflow the row scales."""
    inputs, state, slots, _ = _case(lens, hk, hv, dk, dv, torch.bfloat16, decay=decay)
    scale = dk**-0.5
    before = state.clone()
    got = gated_delta_chunk_prefill(*inputs, state, slots, lens, scale=scale)
    want, finals = _by_definition(inputs, before, slots, lens, scale)
    assert rel(got, want) < BF16_TOL
    for i, final in enumerate(finals):
        assert rel(state[int(slots[i])], final) < BF16_TOL


def test_chunk_terms_solve_the_ut_system() -> None:
    """(I + A) tbeta = diag(beta) on every chunk, with A and the decays written out per entry."""
    lens = (70, 5)
    inputs, _, _, _ = _case(lens, 1, 2, 64, 16, torch.float32)
    q, k, _, a, b, a_log, dt_bias = inputs
    terms = chunk_terms(q, k, a, b, a_log, dt_bias, lens, scale=0.125, operand_dtype=None)
    kn = k / (k.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    qn = q / (q.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    g = -a_log.exp() * torch.log1p((a + dt_bias).exp())
    beta = torch.sigmoid(b)
    for c0, n in ((0, 64), (64, 6), (70, 5)):  # chunks: [0, 64), [64, 70), [70, 75)
        for h in range(2):
            cum = g[c0 : c0 + n, h].cumsum(0)
            kk = kn[c0 : c0 + n, 0] @ kn[c0 : c0 + n, 0].T
            dec = (cum[:, None] - cum[None, :]).exp().tril()
            a_mat = (beta[c0 : c0 + n, h, None] * dec * kk).tril(-1)
            tb = terms.tbeta[c0 : c0 + n, h, :n]
            lhs = (torch.eye(n) + a_mat) @ tb
            torch.testing.assert_close(lhs, torch.diag(beta[c0 : c0 + n, h]), atol=1e-5, rtol=0)
            attn = 0.125 * dec * (qn[c0 : c0 + n, 0] @ kn[c0 : c0 + n, 0].T)
            torch.testing.assert_close(terms.attn[c0 : c0 + n, h, :n], attn, atol=1e-6, rtol=1e-5)
            assert not terms.attn[c0 : c0 + n, h, n:].any()
            scales = terms.scales[c0 : c0 + n, h]
            torch.testing.assert_close(scales[0, 3], cum[-1].exp())
            assert not scales[1:, 3].any()
            # e^{G_last - G_t} / |k_t|; decays summed in another order differ by a few ulp of
            # G (up to ~300 here), hence 1e-3 relative
            torch.testing.assert_close(scales[:, 2] * k[c0 : c0 + n, 0].norm(dim=-1),
                                       (cum[-1] - cum).exp(), rtol=1e-3, atol=1e-30)  # fmt: skip


def test_plan_checks_and_packs_without_a_gpu() -> None:
    lens = (70, 3)
    inputs, state, slots, _ = _case(lens, 2, 4, 128, 32, torch.bfloat16)
    plan = launch.plan(*inputs, state, slots, lens, scale=0.1)
    prepare, recur = plan.launches
    assert prepare.instance == "gdc_prepare<bf16, 128>"
    assert prepare.grid == (2, 2, 2)  # the longest sequence's chunks, key heads, sequences
    assert recur.instance == f"gdc_recur<128, {launch.WARPS}>"
    assert recur.grid == (1, 4, 2) and recur.block == (32 * launch.WARPS, 1, 1)
    assert recur.shared_mem == 2 * launch.stage_bytes(128) <= 227 * 1024
    assert plan.out.shape == (73, 4, 32) and plan.out.dtype == torch.float32
    bad = (inputs[0][:, :, :32], inputs[1][:, :, :32], *inputs[2:])
    with pytest.raises(runtime.KernelInputError, match="key dim"):
        launch.plan(*bad, state, slots, lens, scale=0.1)
    with pytest.raises(runtime.KernelInputError, match="value dim"):
        launch.plan(*inputs[:2], inputs[2][:, :, :24], *inputs[3:], state[..., :24].contiguous(),
                    slots, lens, scale=0.1)  # fmt: skip
    with pytest.raises(runtime.KernelInputError, match="query_lens"):
        launch.plan(*inputs, state, slots, (70, 2), scale=0.1)


def test_launcher_refuses_cpu_tensors() -> None:
    inputs, state, slots, _ = _case((3,), 1, 2, 64, 16, torch.bfloat16)
    with pytest.raises(runtime.KernelInputError, match="CUDA"):
        launch.gated_delta_chunk_prefill(*inputs, state, slots, (3,), scale=0.25)


def test_dispatch_rule(monkeypatch) -> None:
    """bf16, a sequence of CHUNK_MIN_TOKENS or more, Dk 64/128, Dv a multiple of 16: chunked."""
    long = (1, launch.CHUNK_MIN_TOKENS)
    inputs, state, _, _ = _case(long, 1, 2, 128, 16, torch.bfloat16)
    q, _, v = inputs[:3]
    assert dispatch.chunked_delta_prefill(q, v, state, long)
    assert not dispatch.chunked_delta_prefill(q, v, state, (1, launch.CHUNK_MIN_TOKENS - 1))
    assert not dispatch.chunked_delta_prefill(q.float(), v.float(), state, long)
    assert not dispatch.chunked_delta_prefill(q[..., :32], v, state, long)
    assert not dispatch.chunked_delta_prefill(q, v[..., :8], state, long)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "gated_delta_chunk")
    assert not dispatch.chunked_delta_prefill(q, v, state, long)
    assert CHUNK == 64
