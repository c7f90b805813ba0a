"""The speculative verify and fold kernels (kernels/gated_delta_verify) on the GPU.

Each is held bit for bit to the decode kernels it restates (the verify front and recurrence to
W decode-front / narrow decode launches on working copies; the fold to decode launches into the
slots), and to its torch twin within the decode kernels' own tolerances, on fresh random inputs:
several sequences in shuffled slots, column counts 1..W, strided projection slices, NaN in every
slot that must not be touched.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels.gated_delta_decode import launch as delta_cuda
from ninfer.kernels.gated_delta_verify import launch as verify_cuda
from ninfer.kernels.gated_delta_verify import reference as verify_ref
from ninfer.kernels.gated_delta_verify.reference import FoldLayer
from ninfer.kernels.gdn_decode_front import launch as front_cuda
from support.gpu_checks import rel

pytestmark = pytest.mark.gpu
DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
SHAPES = pytest.mark.parametrize(
    "b,hk,hv,dk,dv",
    [(1, 16, 48, 128, 128), (3, 16, 32, 128, 128), (5, 2, 6, 16, 8)],
    ids=["27b-b1", "35b-b3", "tiny-b5"],
)


def _slots(gen, b):
    num_slots = b + 3
    slots = torch.randperm(num_slots, device="cuda", generator=gen)[:b]
    unused = sorted(set(range(num_slots)) - set(slots.tolist()))
    return num_slots, slots, unused


def _front_inputs(gen, b, width, hk, hv, dk, dv, dtype):
    channels = 2 * hk * dk + hv * dv
    rows = b * width
    proj = torch.randn(rows, channels + hv * dv + 2 * hv, device="cuda", generator=gen).to(dtype)
    qkv, _, bb, a = proj.split((channels, hv * dv, hv, hv), dim=-1)  # strided, as the model's
    conv_w = (torch.randn(channels, 4, device="cuda", generator=gen) * 0.5).to(dtype)
    a_log = torch.randn(hv, device="cuda", generator=gen)
    dt_bias = torch.randn(hv, device="cuda", generator=gen)
    num_slots, slots, unused = _slots(gen, b)
    conv = torch.randn(num_slots, channels, 3, device="cuda", generator=gen).to(dtype)
    conv[unused] = float("nan")
    return (qkv, a, bb, conv_w, a_log, dt_bias), conv, slots


@SHAPES
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 4, 6])
def test_verify_front_is_width_decode_fronts(b, hk, hv, dk, dv, dtype, width, gen) -> None:
    args, conv, slots = _front_inputs(gen, b, width, hk, hv, dk, dv, dtype)
    before = conv.clone()
    kw = {"num_k_heads": hk, "head_k_dim": dk}
    got = verify_cuda.gdn_verify_front(*args, conv, slots, width=width, **kw)
    assert torch.equal(conv.nan_to_num(), before.nan_to_num())  # read, never written
    # the decode front, column by column, on a working copy of the conv state
    work = conv.clone()
    qkv, a, bb = (t.reshape(b, width, -1) for t in args[:3])
    cols = [
        front_cuda.gdn_decode_front(qkv[:, j], a[:, j], bb[:, j], *args[3:], work, slots, **kw)
        for j in range(width)
    ]
    for i, name in enumerate(got._fields):
        want = torch.stack([c[i] for c in cols], 1).flatten(0, 1)
        assert torch.equal(got[i], want), name
    twin = verify_ref.gdn_verify_front(*args, conv.clone(), slots, width=width, **kw)
    for name, x, y in zip(got._fields, got, twin, strict=True):
        assert rel(x, y) < (1e-4 if name in ("g", "beta") else TOL[dtype]), name


def _delta_inputs(gen, rows, hk, hv, dk, dv, dtype):
    norm = torch.nn.functional.normalize
    q = norm(torch.randn(rows, hk, dk, device="cuda", generator=gen), dim=-1)
    k = norm(torch.randn(rows, hk, dk, device="cuda", generator=gen), dim=-1)
    v = torch.randn(rows, hv, dv, device="cuda", generator=gen).to(dtype)
    g = -torch.rand(rows, hv, device="cuda", generator=gen) * 3
    beta = torch.rand(rows, hv, device="cuda", generator=gen)
    return q, k, v, g, beta


@SHAPES
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [1, 4, 6])
def test_verify_recurrence_is_width_decode_steps(b, hk, hv, dk, dv, dtype, width, gen) -> None:
    q, k, v, g, beta = _delta_inputs(gen, b * width, hk, hv, dk, dv, dtype)
    num_slots, slots, unused = _slots(gen, b)
    state = torch.randn(num_slots, hv, dk, dv, device="cuda", generator=gen) * 0.5
    state[unused] = float("nan")
    before = state.clone()
    scale = dk**-0.5
    got = verify_cuda.gated_delta_verify(q, k, v, g, beta, state, slots, width=width, scale=scale)
    assert torch.equal(state.nan_to_num(), before.nan_to_num())  # the slots keep their state
    work = state.clone()
    cols = [t.reshape(b, width, *t.shape[1:]) for t in (q, k, v, g, beta)]
    want = torch.stack(
        [
            delta_cuda.gated_delta_rule_decode(
                *(c[:, j] for c in cols), work, slots, scale=scale, variant="narrow"
            )
            for j in range(width)
        ],
        1,
    ).flatten(0, 1)
    assert torch.equal(got, want)
    twin = verify_ref.gated_delta_verify(
        q, k, v, g, beta, state.clone(), slots, width=width, scale=scale
    )
    assert rel(got, twin) < 1e-4


@pytest.mark.parametrize("hk,hv,dk,dv", [(16, 48, 128, 128), (2, 6, 16, 8)], ids=["27b", "tiny"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_fold_is_decode_steps_over_kept_columns(hk, hv, dk, dv, dtype, gen) -> None:
    """Three layers, four verify rows of width 4 folded into shuffled slots, 1..4 columns each."""
    width, num_rec, num_layers = 4, 4, 3
    channels = 2 * hk * dk + hv * dv
    num_slots = num_rec + 2
    rows = torch.tensor([2, 0, 3, 1], device="cuda")
    slots = torch.randperm(num_slots, device="cuda", generator=gen)[:num_rec]
    ncols = torch.tensor([1, 4, 2, 3], device="cuda")
    layers = []
    for _ in range(num_layers):
        q, k, v, g, beta = _delta_inputs(gen, num_rec * width, hk, hv, dk, dv, dtype)
        del q
        wide = torch.randn(num_rec * width, channels + 8, device="cuda", generator=gen).to(dtype)
        layers.append(
            FoldLayer(
                torch.randn(num_slots, channels, 3, device="cuda", generator=gen).to(dtype),
                torch.randn(num_slots, hv, dk, dv, device="cuda", generator=gen) * 0.5,
                wide[:, :channels].reshape(num_rec, width, channels),  # strided, as recorded
                k.reshape(num_rec, width, hk, dk),
                v.reshape(num_rec, width, hv, dv),
                g.reshape(num_rec, width, hv),
                beta.reshape(num_rec, width, hv),
            )
        )
    twins = [FoldLayer(x.conv_state.clone(), x.ssm_state.clone(), *x[2:]) for x in layers]
    untouched = sorted(set(range(num_slots)) - set(slots.tolist()))
    saved = [(x.conv_state[untouched].clone(), x.ssm_state[untouched].clone()) for x in layers]
    # expected delta state: narrow decode launches, column by column, only while c < ncols
    want = []
    for x in layers:
        state = x.ssm_state.clone()
        for i in range(num_rec):
            one = slots[i : i + 1]
            for c in range(int(ncols[i])):
                r = int(rows[i])
                delta_cuda.gated_delta_rule_decode(
                    x.k[r, c][None], x.k[r, c][None], x.v[r, c][None], x.g[r, c][None],
                    x.beta[r, c][None], state, one, scale=1.0, variant="narrow",
                )  # fmt: skip
        want.append(state)
    verify_cuda.fold_layers(layers, slots, rows, ncols, width)
    verify_ref.fold_layers(twins, slots, rows, ncols, width)
    for x, t, w, (conv0, ssm0) in zip(layers, twins, want, saved, strict=True):
        assert torch.equal(x.ssm_state, w)
        assert rel(x.ssm_state, t.ssm_state) < 1e-4
        assert torch.equal(x.conv_state, t.conv_state)  # the conv fold only moves values
        assert torch.equal(x.conv_state[untouched], conv0)
        assert torch.equal(x.ssm_state[untouched], ssm0)


def test_fold_refuses_layers_that_differ(gen) -> None:
    hk, hv, dk, dv, width = 2, 6, 16, 8, 2
    channels = 2 * hk * dk + hv * dv

    def layer(dv_: int) -> FoldLayer:
        q, k, v, g, beta = _delta_inputs(gen, width, hk, hv, dk, dv_, torch.float32)
        return FoldLayer(
            torch.zeros(2, channels, 3, device="cuda"),
            torch.zeros(2, hv, dk, dv_, device="cuda"),
            torch.zeros(1, width, channels, device="cuda"),
            k.reshape(1, width, hk, dk), v.reshape(1, width, hv, dv_),
            g.reshape(1, width, hv), beta.reshape(1, width, hv),
        )  # fmt: skip

    one = torch.zeros(1, dtype=torch.int64, device="cuda")
    with pytest.raises(Exception, match="differ"):
        verify_cuda.fold_layers([layer(dv), layer(2 * dv)], one, one, one + 1, width)


@pytest.mark.parametrize("width", [1, 4, 6])
@pytest.mark.parametrize("dtype", DTYPES)
def test_verify_attention_rows_equal_the_masked_reference(width, dtype, gen) -> None:
    """A verify step's attention through the split-KV kernel, one query per token
    (`paged_rows_attention`), against the gather + causal-mask SDPA path it replaces, for
    sequences at different positions in shuffled pages, the step's own KV already stored."""
    from ninfer.model.batch import ForwardBatch
    from ninfer.model.layers.gated_attention import (
        build_attention_metadata,
        paged_attention,
        paged_rows_attention,
    )

    hq, hk, d, page = 24, 4, 256, 16
    positions = [5, 37, 70]  # tokens already in KV per sequence
    b, width_pages = len(positions), 6
    pages = torch.randn(b * width_pages + 1, page, hk, d, device="cuda", generator=gen)
    k_pages, v_pages = pages.to(dtype), torch.randn_like(pages).to(dtype)
    table = torch.randperm(b * width_pages, device="cuda", generator=gen).view(b, width_pages)
    batch = ForwardBatch(
        input_ids=torch.zeros(b * width, dtype=torch.int64, device="cuda"),
        positions=torch.zeros(b * width, dtype=torch.int64, device="cuda"),
        cu_seqlens=torch.arange(b + 1, dtype=torch.int32, device="cuda") * width,
        num_computed=torch.tensor(positions, device="cuda"),
        page_table=table,
        state_slots=torch.arange(b, device="cuda"),
        query_lens=(width,) * b,
        max_kv_len=width_pages * page,
        verify_width=width if width > 1 else 0,
        static_shapes=True,
    )
    meta = build_attention_metadata(batch, page)
    q = torch.randn(b * width, hq, d, device="cuda", generator=gen).to(dtype)
    got = paged_rows_attention(q, k_pages, v_pages, meta, scale=d**-0.5)
    want = paged_attention(q, k_pages, v_pages, meta, scale=d**-0.5)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert rel(got.float(), want.float()) < TOL[dtype]
