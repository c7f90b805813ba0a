"""The kernels' torch twins equal the model's own layer functions (CPU, fresh random inputs).

kernels/ may not import model/, so each twin restates its maths; these tests hold the two copies
together, and check that dispatch falls back to the twins on CPU tensors.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch, runtime
from ninfer.kernels.add_rms_norm.reference import add_rms_norm
from ninfer.kernels.expert_gemv.reference import expert_gemv
from ninfer.kernels.gated_delta_decode.reference import gated_delta_rule_decode
from ninfer.kernels.gated_rms_norm.launch import _gate_layout
from ninfer.kernels.gated_rms_norm.reference import gated_rms_norm
from ninfer.kernels.gdn_decode_front.reference import gdn_decode_front
from ninfer.kernels.paged_decode_attention.reference import paged_decode_attention
from ninfer.kernels.qk_norm_rope.reference import qk_norm_rope
from ninfer.kernels.silu_mul.reference import silu_mul
from ninfer.model.batch import ForwardBatch
from ninfer.model.layers import gated_attention as model_attention
from ninfer.model.layers import gated_deltanet as model_deltanet
from ninfer.model.layers import norm as model_norm
from ninfer.model.layers import rope as model_rope

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 48)], ids=["2d", "3d"])
def test_add_rms_norm_twin_is_add_then_model_norm(dtype: torch.dtype, shape: tuple) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=g).to(dtype)
    r = torch.randn(shape, generator=g).to(dtype)
    w = (torch.randn(shape[-1], generator=g) * 0.1).to(dtype)
    normed, summed = add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(summed, x + r)
    assert torch.equal(normed, model_norm.rms_norm(x + r, w, 1e-6))
    plain, same = add_rms_norm(x, None, w, 1e-6)
    assert same is x
    assert torch.equal(plain, model_norm.rms_norm(x, w, 1e-6))


@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16], ids=["keep", "to-bf16"])
def test_gated_rms_norm_twin_matches_model(out_dtype: torch.dtype | None) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 4, 32, generator=g)  # fp32, as the delta rule returns it
    z = torch.randn(6, 4, 32, generator=g).to(torch.bfloat16)
    w = torch.randn(32, generator=g).to(torch.bfloat16)
    want = model_norm.gated_rms_norm(x, z, w, 1e-6)
    if out_dtype is not None:
        want = want.to(out_dtype)
    got = gated_rms_norm(x, z, w, 1e-6, out_dtype)
    assert got.dtype == want.dtype
    assert torch.equal(got, want)


def _delta_inputs(seed: int, b: int = 3, hk: int = 2, hv: int = 6, dk: int = 16, dv: int = 8):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(b, hk, dk, generator=g), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(b, hk, dk, generator=g), dim=-1)
    v = torch.randn(b, hv, dv, generator=g)
    decay = -torch.rand(b, hv, generator=g) * 2
    beta = torch.rand(b, hv, generator=g)
    state = torch.randn(b + 2, hv, dk, dv, generator=g)
    slots = torch.randperm(b + 2, generator=g)[:b]
    return q, k, v, decay, beta, state, slots


def test_gated_delta_twin_matches_model_step() -> None:
    q, k, v, decay, beta, state, slots = _delta_inputs(3)
    mine, theirs = state.clone(), state.clone()
    out = gated_delta_rule_decode(q, k, v, decay, beta, mine, slots, scale=0.25)
    want = model_deltanet.gated_delta_rule_decode(q, k, v, decay, beta, theirs, slots, scale=0.25)
    torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-6)
    untouched = [s for s in range(state.shape[0]) if s not in slots.tolist()]
    assert torch.equal(mine[untouched], state[untouched])
    assert not torch.equal(mine[slots], state[slots])


def test_gated_delta_twin_is_the_recurrence_definition() -> None:
    """Independent of the model code: one step of the rule written with explicit loops."""
    q, k, v, decay, beta, state, slots = _delta_inputs(4, b=2, hk=1, hv=2, dk=4, dv=3)
    before = state.clone()
    out = gated_delta_rule_decode(q, k, v, decay, beta, state, slots, scale=0.5)
    for b, slot in enumerate(slots.tolist()):
        for h in range(2):
            s = before[slot, h] * decay[b, h].exp()
            kk, qq = k[b, 0], q[b, 0] * 0.5
            delta = beta[b, h] * (v[b, h] - s.T @ kk)
            s = s + torch.outer(kk, delta)
            torch.testing.assert_close(state[slot, h], s)
            torch.testing.assert_close(out[b, h], s.T @ qq)


def test_dispatch_runs_the_twins_on_cpu() -> None:
    assert not dispatch.use_cuda_kernels(torch.zeros(1))
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 32, generator=g)
    w = torch.randn(32, generator=g)
    assert torch.equal(dispatch.rms_norm(x, w, 1e-6), model_norm.rms_norm(x, w, 1e-6))
    q, k, v, decay, beta, state, slots = _delta_inputs(6)
    a, b = state.clone(), state.clone()
    out = dispatch.gated_delta_rule_decode(q, k, v, decay, beta, a, slots, scale=0.3)
    assert torch.equal(out, gated_delta_rule_decode(q, k, v, decay, beta, b, slots, scale=0.3))
    gate_up = torch.randn(3, 64, generator=g)
    assert torch.equal(dispatch.silu_mul(gate_up), silu_mul(gate_up))
    qkv, a, bb, conv_w, a_log, dt_bias, conv_state, slots = _front_inputs(10, torch.float32)
    mine, theirs = conv_state.clone(), conv_state.clone()
    got = dispatch.gdn_decode_front(
        qkv, a, bb, conv_w, a_log, dt_bias, mine, slots, num_k_heads=2, head_k_dim=16
    )
    want = gdn_decode_front(
        qkv, a, bb, conv_w, a_log, dt_bias, theirs, slots, num_k_heads=2, head_k_dim=16
    )
    assert all(torch.equal(x, y) for x, y in zip(got, want, strict=True))


def _front_inputs(seed: int, dtype: torch.dtype, b: int = 3, hk: int = 2, hv: int = 6):
    """Random decode-front inputs: Dk = 16, Dv = 8, conv kernel 4, b of b + 2 slots in use."""
    g = torch.Generator().manual_seed(seed)
    channels = 2 * hk * 16 + hv * 8
    qkv = torch.randn(b, channels, generator=g).to(dtype)
    a = torch.randn(b, hv, generator=g).to(dtype)
    bb = torch.randn(b, hv, generator=g).to(dtype)
    conv_w = (torch.randn(channels, 4, generator=g) * 0.5).to(dtype)
    a_log = torch.randn(hv, generator=g)
    dt_bias = torch.randn(hv, generator=g)
    conv_state = torch.randn(b + 2, channels, 3, generator=g).to(dtype)
    slots = torch.randperm(b + 2, generator=g)[:b]
    return qkv, a, bb, conv_w, a_log, dt_bias, conv_state, slots


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_front_twin_is_the_model_decode_branch(dtype: torch.dtype) -> None:
    """Bit-identical to the model's own ops (so wiring the twin changes no CPU result)."""
    qkv, a, b, conv_w, a_log, dt_bias, conv_state, slots = _front_inputs(7, dtype)
    mine, theirs = conv_state.clone(), conv_state.clone()
    q, k, v, decay, beta = gdn_decode_front(
        qkv, a, b, conv_w, a_log, dt_bias, mine, slots, num_k_heads=2, head_k_dim=16
    )
    mixed = model_deltanet.causal_conv1d_update(qkv, conv_w, theirs, slots)
    assert torch.equal(mine, theirs)
    want_q, want_k, want_v = mixed.split((32, 32, 48), dim=-1)
    assert torch.equal(q, model_norm.l2_norm(want_q.reshape(3, 2, 16)))
    assert torch.equal(k, model_norm.l2_norm(want_k.reshape(3, 2, 16)))
    assert torch.equal(v, want_v.reshape(3, 6, 8))
    assert torch.equal(beta, torch.sigmoid(b.float()))
    want_g = -a_log.exp() * torch.nn.functional.softplus(a.float() + dt_bias)
    assert torch.equal(decay, want_g)


def test_decode_front_twin_is_the_conv_definition() -> None:
    """Independent of the model code: the conv window, its shift and the L2 norm by hand."""
    qkv, a, b, conv_w, a_log, dt_bias, conv_state, slots = _front_inputs(8, torch.float32)
    before = conv_state.clone()
    q, _, v, _, _ = gdn_decode_front(
        qkv, a, b, conv_w, a_log, dt_bias, conv_state, slots, num_k_heads=2, head_k_dim=16
    )
    for row, slot in enumerate(slots.tolist()):
        window = torch.cat((before[slot], qkv[row][:, None]), dim=1)  # [C, 4]
        y = torch.stack([(window[c] * conv_w[c]).sum() for c in range(window.shape[0])])
        y = y * torch.sigmoid(y)
        torch.testing.assert_close(conv_state[slot], window[:, 1:])
        torch.testing.assert_close(q[row, 1], y[16:32] / y[16:32].norm())
        torch.testing.assert_close(v[row].reshape(-1), y[64:])
    untouched = [s for s in range(conv_state.shape[0]) if s not in slots.tolist()]
    assert torch.equal(conv_state[untouched], before[untouched])


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_twin_is_the_model_swiglu_maths(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(9)
    gate_up = torch.randn(5, 2 * 24, generator=g).to(dtype)
    gate, up = gate_up[:, :24], gate_up[:, 24:]
    assert torch.equal(silu_mul(gate_up), torch.nn.functional.silu(gate) * up)
    want = (gate.double() * torch.sigmoid(gate.double()) * up.double()).to(dtype)
    torch.testing.assert_close(silu_mul(gate_up), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("rows_per_input", [1, 3])
def test_expert_gemv_twin_is_a_matvec_per_assignment(rows_per_input: int) -> None:
    g = torch.Generator().manual_seed(11)
    weight = torch.randn(5, 12, 16, generator=g)
    x = torch.randn(4, 16, generator=g)
    ids = torch.randint(0, 5, (4 * rows_per_input,), generator=g)
    got = expert_gemv(x, weight, ids, rows_per_input=rows_per_input)
    for a, e in enumerate(ids.tolist()):
        torch.testing.assert_close(got[a], weight[e] @ x[a // rows_per_input])


def test_paged_decode_twin_matches_model_paged_attention() -> None:
    """Decode batch over shuffled pages of different lengths: twin vs the model's reference."""
    g = torch.Generator().manual_seed(12)
    page_size, num_kv_heads, head_dim = 4, 2, 32
    k_pages = torch.randn(20, page_size, num_kv_heads, head_dim, generator=g)
    v_pages = torch.randn(20, page_size, num_kv_heads, head_dim, generator=g)
    pool = torch.randperm(20, generator=g).tolist()
    tables = [pool[0:5], pool[5:7], pool[7:16]]
    num_computed = [17, 4, 35]
    batch = ForwardBatch.decode(
        [1, 2, 3], num_computed=num_computed, page_tables=tables, state_slots=[0, 1, 2]
    )
    meta = model_attention.build_attention_metadata(batch, page_size)
    q = torch.randn(3, 6, head_dim, generator=g)
    want = model_attention.paged_attention(q, k_pages, v_pages, meta, scale=0.2)
    got = paged_decode_attention(q, k_pages, v_pages, meta.page_table, meta.kv_lens, scale=0.2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qk_norm_rope_twin_is_the_model_norm_then_rope(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(13)
    proj = torch.randn(5, 4 * 2 * 32 + 2 * 32, generator=g).to(dtype)  # gated q, then k
    q = proj[:, :256].view(5, 4, 2, 32)[:, :, 0]  # strided, as the model passes it
    k = proj[:, 256:].view(5, 2, 32)
    qw, kw = (torch.randn(32, generator=g) * 0.1).to(dtype), torch.randn(32, generator=g).to(dtype)
    inv_freq = model_rope.rope_inv_freq(16, 10000.0)
    axis = model_rope.mrope_axis_map((2, 3, 3), True)
    cos, sin = model_rope.rope_cos_sin(torch.tensor([0, 3, 9, 100, 7]), inv_freq, axis)
    got_q, got_k = qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6)
    want_q = model_rope.apply_rope(model_norm.rms_norm(q, qw, 1e-6), cos, sin)
    want_k = model_rope.apply_rope(model_norm.rms_norm(k, kw, 1e-6), cos, sin)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(got_q[..., 16:], model_norm.rms_norm(q, qw, 1e-6)[..., 16:])  # pass-through


@pytest.mark.parametrize("tokens", [1, 2, 5])
def test_gated_norm_gate_layout_addresses_every_row(tokens: int) -> None:
    """The kernel's row offset (r // inner) * outer + (r % inner) * n lands on z's row r."""
    heads, n = 6, 16
    proj = torch.randn(tokens, 3 * heads * n + 7)
    z = proj[:, heads * n : 2 * heads * n].view(tokens, heads, n)
    inner, outer = _gate_layout(z)
    flat = proj.reshape(-1)
    base = z.storage_offset()
    for r in range(tokens * heads):
        start = base + (r // inner) * outer + (r % inner) * n
        assert torch.equal(flat[start : start + n], z[r // heads, r % heads])
    if tokens > 1:  # heads outermost is not expressible: the launcher copies instead
        assert _gate_layout(z.transpose(0, 1)) == (0, 0)


def test_kernels_can_be_switched_off_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NINFER_KERNELS_OFF", "paged_decode_attention, gated_rms_norm_reads_x")
    assert dispatch.switched_off("paged_decode_attention")
    assert dispatch.switched_off("gated_rms_norm")  # a test name names its op
    assert not dispatch.switched_off("add_rms_norm")
    monkeypatch.setenv("NINFER_KERNELS_OFF", "")
    assert not dispatch.switched_off("paged_decode_attention")


def test_runtime_rejects_what_the_kernels_cannot_take() -> None:
    with pytest.raises(runtime.KernelInputError, match="CUDA device"):
        runtime.check_cuda(torch.zeros(2))
    with pytest.raises(runtime.KernelInputError, match="x has dtype torch.float16"):
        runtime.cuda_type(torch.zeros(2, dtype=torch.float16), "x")
    assert [runtime.block_size(n) for n in (1, 32, 33, 128, 5120)] == [32, 32, 64, 128, 1024]


@pytest.mark.skipif(runtime.cupy_available(), reason="CuPy and a GPU are present")
def test_kernels_say_why_they_cannot_run_without_cupy() -> None:
    with pytest.raises(runtime.KernelUnavailable, match="CuPy"):
        runtime.get_kernel("add_rms_norm", "add_rms_norm<float, true>", torch.device("cuda:0"))
