"""The gated-delta prefill twin against the model's token-by-token definition (CPU).

The reference side is built independently: q/k normalised as x / sqrt(sum x^2 + 1e-6), softplus
as log1p(exp(.)), sigmoid as 1 / (1 + exp(-.)), then `recurrent_gated_delta_rule` per sequence.
Fresh random inputs per case; fp32 results within 1e-4 (norm of the difference over the norm of
the reference); slots no sequence names are NaN-poisoned and must come back untouched.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch, runtime
from ninfer.kernels.gated_delta_prefill import launch
from ninfer.kernels.gated_delta_prefill.reference import gated_delta_prefill
from ninfer.model.layers.gated_deltanet import recurrent_gated_delta_rule
from support.gpu_checks import rel


def _case(seed, lens, hk, hv, dk, dv, dtype):
    """Raw conv-output q/k/v and gate projections: column views of wide rows, as in the model."""
    gen = torch.Generator().manual_seed(seed)
    num_tokens = sum(lens)
    width = 2 * hk * dk + hv * dv
    mixed = torch.randn(num_tokens, width + 5, generator=gen).to(dtype)
    q = mixed[:, : hk * dk].view(num_tokens, hk, dk)
    k = mixed[:, hk * dk : 2 * hk * dk].view(num_tokens, hk, dk)
    v = mixed[:, 2 * hk * dk : width].view(num_tokens, hv, dv)
    gates = torch.randn(num_tokens, 2 * hv + 3, generator=gen).to(dtype)
    a, b = gates[:, :hv], gates[:, hv : 2 * hv]
    a_log = torch.randn(hv, generator=gen)
    dt_bias = torch.randn(hv, generator=gen)
    num_slots = len(lens) + 2
    state = torch.randn(num_slots, hv, dk, dv, generator=gen) * 0.5
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
            q[span], k[span], v[span], g[span], beta[span], state[int(slots[i])], scale=scale
        )
        outs.append(o)
        finals.append(final)
        start += n
    return torch.cat(outs), finals


@pytest.mark.parametrize(
    "lens,hk,hv,dk,dv",
    [
        ((1,), 2, 6, 16, 8),
        ((5, 1, 70), 2, 6, 16, 8),  # 70 tokens: more than one 64-token chunk
        ((1, 1, 1, 2), 4, 8, 32, 16),
        ((33, 2), 1, 1, 16, 24),
        ((20,), 2, 4, 64, 32),
    ],
    ids=["one-token", "mixed", "all-short", "single-head", "dk64"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_twin_matches_recurrent_definition(lens, hk, hv, dk, dv, dtype) -> None:
    inputs, state, slots, unused = _case(sum(lens) + hv + dk, lens, hk, hv, dk, dv, dtype)
    scale = dk**-0.5
    before = state.clone()
    got = gated_delta_prefill(*inputs, state, slots, lens, scale=scale)
    want, finals = _by_definition(inputs, before, slots, lens, scale)
    assert got.shape == (sum(lens), hv, dv) and got.dtype == torch.float32
    assert rel(got, want) < 1e-4
    for i, final in enumerate(finals):
        assert rel(state[int(slots[i])], final) < 1e-4
    assert state[unused].isnan().all()


def test_views_read_like_dense_copies() -> None:
    lens = (7, 3)
    inputs, state, slots, _ = _case(5, lens, 2, 4, 16, 8, torch.float32)
    dense_state = state.clone()
    got = gated_delta_prefill(*inputs, state, slots, lens, scale=0.25)
    dense = tuple(t.contiguous() for t in inputs)
    want = gated_delta_prefill(*dense, dense_state, slots, lens, scale=0.25)
    assert torch.equal(got, want)
    torch.testing.assert_close(state, dense_state, rtol=0, atol=0, equal_nan=True)


def test_dispatch_runs_the_twin_on_cpu() -> None:
    lens = (4, 9)
    inputs, state, slots, _ = _case(6, lens, 2, 6, 16, 8, torch.bfloat16)
    theirs = state.clone()
    cu = torch.tensor([0, 4, 13])
    got = dispatch.gated_delta_prefill(*inputs, state, slots, lens, scale=0.25, cu_seqlens=cu)
    assert torch.equal(got, gated_delta_prefill(*inputs, theirs, slots, lens, scale=0.25))
    torch.testing.assert_close(state, theirs, rtol=0, atol=0, equal_nan=True)


def test_launcher_refuses_cpu_tensors() -> None:
    inputs, state, slots, _ = _case(7, (3,), 2, 4, 16, 8, torch.float32)
    with pytest.raises(runtime.KernelInputError, match="CUDA"):
        launch.gated_delta_prefill(*inputs, state, slots, (3,), scale=0.25)
