"""The prefill conv and gated-delta kernels against their torch twins (GPU only).

The twins run on the CPU copies of the same inputs (so no TF32 or cuDNN choice can move the
reference). Tolerances (METHOD.md): bf16 outputs within 1e-2 relative (norm of the difference
over the norm of the twin's result), fp32 outputs and states within 1e-4; conv states are exact
copies of inputs. State slots no sequence names are NaN-poisoned and must stay NaN.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels.causal_conv1d import launch as conv_cuda
from ninfer.kernels.causal_conv1d import reference as conv_ref
from ninfer.kernels.gated_delta_prefill import launch as delta_cuda
from ninfer.kernels.gated_delta_prefill import reference as delta_ref
from ninfer.model.batch import ForwardBatch
from ninfer.model.layers.gated_deltanet import (
    DeltaNetWeights,
    gated_deltanet,
    recurrent_gated_delta_rule,
)
from support.gpu_checks import rel

pytestmark = pytest.mark.gpu
TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-4}
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]

# (lens, Hk, Hv, Dk, Dv): real model shapes at T = 2048 split into sequences, then tiny/odd ones.
SHAPES = [
    pytest.param((1500, 7, 1, 540), 16, 48, 128, 128, id="27b-2048-mixed"),
    pytest.param((2048,), 16, 48, 128, 128, id="27b-2048-one"),
    pytest.param((300, 9, 1), 16, 32, 128, 128, id="35b-mixed"),
    pytest.param((1, 2, 3, 40, 1, 33), 2, 6, 16, 8, id="tiny-dv8"),
    pytest.param((65, 1, 2), 4, 8, 32, 40, id="tiny-dv40"),
    pytest.param((31, 32, 33), 2, 2, 64, 16, id="tiny-dk64"),
]


def _slots(gen: torch.Generator, num_seqs: int) -> tuple[torch.Tensor, list[int], int]:
    num_slots = num_seqs + 3
    slots = torch.randperm(num_slots, device="cuda", generator=gen)[:num_seqs]
    unused = sorted(set(range(num_slots)) - set(slots.tolist()))
    return slots, unused, num_slots


def _offsets(lens: tuple[int, ...], dtype: torch.dtype = torch.int32) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=dtype, device="cuda")


def _cpu(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.to("cpu", copy=True) for t in tensors)


# --- causal conv1d ---------------------------------------------------------------------------


@pytest.mark.parametrize("lens,hk,hv,dk,dv", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("taps", [4, 3])
def test_causal_conv1d(lens, hk, hv, dk, dv, dtype, taps, gen) -> None:
    """x as the qkv columns of the fused projection output (rows strided), as in the model."""
    channels = 2 * hk * dk + hv * dv
    num_tokens = sum(lens)
    proj = torch.randn(num_tokens, channels + hv * dv + 2 * hv, device="cuda", generator=gen)
    x = proj.to(dtype)[:, :channels]
    weight = (torch.randn(channels, taps, device="cuda", generator=gen) * 0.5).to(dtype)
    slots, unused, num_slots = _slots(gen, len(lens))
    state = torch.randn(num_slots, channels, taps - 1, device="cuda", generator=gen).to(dtype)
    state[unused] = float("nan")
    ref_state = state.to("cpu", copy=True)
    want = conv_ref.causal_conv1d(*_cpu(x, weight), ref_state, slots.cpu(), lens)
    got = conv_cuda.causal_conv1d(x, weight, state, slots, lens, cu_seqlens=_offsets(lens))
    assert got.shape == want.shape and got.dtype == dtype and got.is_contiguous()
    assert rel(got, want) < TOL[dtype]
    assert torch.equal(state[slots].cpu(), ref_state[slots.cpu()])  # copies of inputs, exact
    assert state[unused].isnan().all()


@pytest.mark.parametrize("state_dtype", DTYPES)
def test_causal_conv1d_mixed_dtypes_and_host_offsets(state_dtype, gen) -> None:
    """bf16 x with an fp32 or bf16 state and fp32 taps; offsets built from the host lengths."""
    lens = (1, 2, 70, 1)
    x = torch.randn(sum(lens), 96, device="cuda", generator=gen).to(torch.bfloat16)
    weight = torch.randn(96, 4, device="cuda", generator=gen)
    slots, unused, num_slots = _slots(gen, len(lens))
    state = torch.randn(num_slots, 96, 3, device="cuda", generator=gen).to(state_dtype)
    state[unused] = float("nan")
    ref_state = state.to("cpu", copy=True)
    want = conv_ref.causal_conv1d(*_cpu(x, weight), ref_state, slots.cpu(), lens)
    got = conv_cuda.causal_conv1d(x, weight, state, slots, lens)
    assert rel(got, want) < 1e-2
    assert torch.equal(state[slots].cpu(), ref_state[slots.cpu()])
    assert state[unused].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "channels,row,offset",
    [(10240, 16480, 0), (112, 172, 0), (96, 101, 0), (97, 97, 0), (96, 96, 1)],
    ids=["27b-qkv-columns", "tiny-strided", "odd-row-stride", "odd-channels", "unaligned-base"],
)
def test_causal_conv1d_wide_channels_keep_the_bits(
    channels, row, offset, dtype, gen, monkeypatch
) -> None:
    """V = 4 channels per thread where x allows aligned 4-wide loads, else 1; either way the
    same outputs and states bit for bit (`NINFER_KERNELS_OFF=conv_wide` forces 1)."""
    lens = (700, 1, 2, 61)
    flat = torch.randn(sum(lens) * row + offset, device="cuda", generator=gen).to(dtype)
    x = flat[offset:].view(sum(lens), row)[:, :channels]
    weight = (torch.randn(channels, 4, device="cuda", generator=gen) * 0.5).to(dtype)
    slots, _, num_slots = _slots(gen, len(lens))
    state = torch.randn(num_slots, channels, 3, device="cuda", generator=gen).to(dtype)
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    aligned = channels % 4 == 0 and row % 4 == 0 and offset == 0
    assert conv_cuda.channels_per_thread(x) == (4 if aligned else 1)
    wide_state = state.clone()
    wide = conv_cuda.causal_conv1d(x, weight, wide_state, slots, lens)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "conv_wide")
    assert conv_cuda.channels_per_thread(x) == 1
    narrow_state = state.clone()
    narrow = conv_cuda.causal_conv1d(x, weight, narrow_state, slots, lens)
    assert torch.equal(wide, narrow)
    assert torch.equal(wide_state, narrow_state)
    want = conv_ref.causal_conv1d(*_cpu(x, weight), state.cpu(), slots.cpu(), lens)
    assert rel(wide, want) < TOL[dtype]


# --- gated delta prefill ---------------------------------------------------------------------


def _delta_case(gen, lens, hk, hv, dk, dv, dtype):
    """Raw q/k/v as views of a conv output and a/b as columns of the fused projection."""
    num_tokens = sum(lens)
    channels = 2 * hk * dk + hv * dv
    mixed = torch.randn(num_tokens, channels, device="cuda", generator=gen).to(dtype)
    q = mixed[:, : hk * dk].view(num_tokens, hk, dk)
    k = mixed[:, hk * dk : 2 * hk * dk].view(num_tokens, hk, dk)
    v = mixed[:, 2 * hk * dk :].view(num_tokens, hv, dv)
    proj = torch.randn(num_tokens, hv * dv + 2 * hv, device="cuda", generator=gen).to(dtype)
    b, a = proj[:, hv * dv : hv * dv + hv], proj[:, hv * dv + hv :]
    a_log = torch.rand(hv, device="cuda", generator=gen) * 2 - 1
    dt_bias = torch.randn(hv, device="cuda", generator=gen)
    slots, unused, num_slots = _slots(gen, len(lens))
    state = torch.randn(num_slots, hv, dk, dv, device="cuda", generator=gen) * 0.5
    state[unused] = float("nan")
    return (q, k, v, a, b, a_log, dt_bias), state, slots, unused


@pytest.mark.parametrize("lens,hk,hv,dk,dv", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_delta_prefill(lens, hk, hv, dk, dv, dtype, gen) -> None:
    inputs, state, slots, unused = _delta_case(gen, lens, hk, hv, dk, dv, dtype)
    scale = dk**-0.5
    ref_state = state.to("cpu", copy=True)
    want = delta_ref.gated_delta_prefill(*_cpu(*inputs), ref_state, slots.cpu(), lens, scale=scale)
    got = delta_cuda.gated_delta_prefill(
        *inputs, state, slots, lens, scale=scale, cu_seqlens=_offsets(lens, torch.int64)
    )
    assert got.shape == want.shape == (sum(lens), hv, dv) and got.dtype == torch.float32
    assert rel(got, want) < 1e-4  # fp32 results whatever the input dtype
    cpu_slots = slots.cpu()
    assert rel(state[slots], ref_state[cpu_slots]) < 1e-4
    assert state[unused].isnan().all()


@pytest.mark.parametrize("decay", ["mild", "strong"])
def test_gated_delta_prefill_matches_the_recurrent_definition(decay: str, gen) -> None:
    """Token by token at the 27B head shape across a chunk edge (not through the chunked twin);
    strong decays (down to ~1e-30 per token) make the lazy scale fold inside chunks."""
    lens = (40, 1, 17)
    inputs, state, slots, _ = _delta_case(gen, lens, 16, 48, 128, 128, torch.float32)
    q, k, v, a, b, a_log, dt_bias = inputs
    if decay == "strong":
        a_log = a_log + 2.5
    before = state.clone()
    got = delta_cuda.gated_delta_prefill(
        q, k, v, a, b, a_log, dt_bias, state, slots, lens, scale=128**-0.5
    )
    qn = q / (q.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    kn = k / (k.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()
    g = -a_log.exp() * torch.log1p((a + dt_bias).exp())
    beta = 1.0 / (1.0 + (-b).exp())
    start = 0
    for i, n in enumerate(lens):
        span = slice(start, start + n)
        o, final = recurrent_gated_delta_rule(
            qn[span], kn[span], v[span], g[span], beta[span], before[slots[i]], scale=128**-0.5
        )
        assert rel(got[span], o) < 1e-4
        assert rel(state[slots[i]], final) < 1e-4
        start += n


# --- the layer -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_prefill_uses_the_kernels_and_matches_the_twins(dtype, gen, monkeypatch) -> None:
    """The layer's prefill with the kernels against the same call with NINFER_KERNELS=torch."""
    hk, hv, dk, dv, hidden = 4, 8, 128, 128, 256
    channels = 2 * hk * dk + hv * dv

    def w(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device="cuda", generator=gen) / shape[-1] ** 0.5).to(dtype)

    weights = DeltaNetWeights(
        in_proj_qkv=w(channels, hidden),
        in_proj_z=w(hv * dv, hidden),
        in_proj_b=w(hv, hidden),
        in_proj_a=w(hv, hidden),
        conv1d=w(channels, 4),
        dt_bias=torch.randn(hv, device="cuda", generator=gen),
        A_log=torch.rand(hv, device="cuda", generator=gen),
        norm=w(dv) + 1,
        out_proj=w(hidden, hv * dv),
    )
    lens = (37, 1, 200)
    x = torch.randn(sum(lens), hidden, device="cuda", generator=gen).to(dtype)
    batch = ForwardBatch(
        input_ids=torch.zeros(sum(lens), dtype=torch.int64, device="cuda"),
        positions=torch.arange(sum(lens), device="cuda"),
        cu_seqlens=_offsets(lens),
        num_computed=torch.zeros(len(lens), dtype=torch.int64, device="cuda"),
        page_table=torch.zeros(len(lens), 1, dtype=torch.int32, device="cuda"),
        state_slots=torch.tensor([2, 0, 3], device="cuda"),
        query_lens=lens,
        max_kv_len=max(lens),
    )
    conv_state = torch.randn(4, channels, 3, device="cuda", generator=gen).to(dtype)
    ssm_state = torch.randn(4, hv, dk, dv, device="cuda", generator=gen) * 0.1
    states = (conv_state.clone(), ssm_state.clone())
    got = gated_deltanet(
        x, weights, conv_state=conv_state, ssm_state=ssm_state, batch=batch, eps=1e-6
    )
    monkeypatch.setenv("NINFER_KERNELS", "torch")
    want = gated_deltanet(
        x, weights, conv_state=states[0], ssm_state=states[1], batch=batch, eps=1e-6
    )
    # A wiring check: the twins' GPU conv may round differently (cuDNN, TF32), and the kernels'
    # own tolerances are held by the tests above.
    assert rel(got, want) < 1e-2
    assert torch.equal(conv_state, states[0])  # the last inputs, copied exactly
    assert rel(ssm_state, states[1]) < 1e-2


# --- edges: chunk boundaries, tiny and partial tiles, strong decays ---------------------------

EDGE_SHAPES = [
    pytest.param((1500, 7, 1, 540), 16, 48, 128, 128, id="27b-2048-mixed"),
    pytest.param((2048,), 16, 32, 128, 128, id="35b-2048-one"),
    pytest.param((16, 17, 15, 32, 33, 1), 2, 6, 128, 24, id="chunk-edges"),
    pytest.param((5, 2, 19), 1, 3, 16, 17, id="tiny-dk16-dv17"),
    pytest.param((48, 3), 2, 4, 32, 1, id="tiny-dv1"),
    pytest.param((64, 9), 4, 4, 64, 130, id="dk64-dv130"),
]


@pytest.mark.parametrize("lens,hk,hv,dk,dv", EDGE_SHAPES)
@pytest.mark.parametrize("decay", ["mild", "strong"])
def test_gated_delta_prefill_edges_and_strong_decays(lens, hk, hv, dk, dv, decay, gen) -> None:
    """Strong decays make the lazy scale fold back into the state every few tokens."""
    inputs, state, slots, unused = _delta_case(gen, lens, hk, hv, dk, dv, torch.bfloat16)
    if decay == "strong":  # g = -exp(A_log) softplus(a + dt): about -20 to -200 per token
        a_log = torch.full_like(inputs[5], 3.0)
        dt_bias = torch.full_like(inputs[6], 2.0)
        inputs = (*inputs[:5], a_log, dt_bias)
    scale = dk**-0.5
    ref_state = state.to("cpu", copy=True)
    want = delta_ref.gated_delta_prefill(*_cpu(*inputs), ref_state, slots.cpu(), lens, scale=scale)
    got = delta_cuda.gated_delta_prefill(
        *inputs, state, slots, lens, scale=scale, cu_seqlens=_offsets(lens, torch.int64)
    )
    assert got.shape == (sum(lens), hv, dv) and got.dtype == torch.float32
    assert rel(got, want) < 1e-4
    assert rel(state[slots], ref_state[slots.cpu()]) < 1e-4
    assert state[unused].isnan().all()
