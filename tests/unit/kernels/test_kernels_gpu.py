"""Each CUDA kernel against its torch twin on fresh random inputs (GPU only).

Tolerances (METHOD.md): bf16 outputs within 1e-2 relative (norm of the difference over the norm
of the twin's result), fp32 outputs and states within 1e-4. State slots that no row names must
come back bit-identical (NaN-poisoned, so a stray read or write shows).
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch
from ninfer.kernels.add_rms_norm import launch as add_norm_cuda
from ninfer.kernels.add_rms_norm import reference as add_norm_ref
from ninfer.kernels.expert_gemv import launch as expert_cuda
from ninfer.kernels.expert_gemv import reference as expert_ref
from ninfer.kernels.gated_delta_decode import launch as delta_cuda
from ninfer.kernels.gated_delta_decode import reference as delta_ref
from ninfer.kernels.gated_rms_norm import launch as gated_cuda
from ninfer.kernels.gated_rms_norm import reference as gated_ref
from ninfer.kernels.gdn_decode_front import launch as front_cuda
from ninfer.kernels.gdn_decode_front import reference as front_ref
from ninfer.kernels.paged_decode_attention import launch as paged_cuda
from ninfer.kernels.paged_decode_attention import reference as paged_ref
from ninfer.kernels.qk_norm_rope import launch as qk_cuda
from ninfer.kernels.qk_norm_rope import reference as qk_ref
from ninfer.kernels.silu_mul import launch as silu_mul_cuda
from ninfer.kernels.silu_mul import reference as silu_mul_ref
from support.gpu_checks import capture_graph, rel

pytestmark = pytest.mark.gpu
TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-4}
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 5120), (8, 5120), (7, 2048), (96, 256), (5, 48)])
def test_add_rms_norm(dtype: torch.dtype, rows: int, n: int, gen: torch.Generator) -> None:
    x = torch.randn(rows, n, device="cuda", generator=gen).to(dtype)
    r = torch.randn(rows, n, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(n, device="cuda", generator=gen) * 0.1).to(dtype)
    normed, summed = add_norm_cuda.add_rms_norm(x, r, w, 1e-6)
    want_normed, want_summed = add_norm_ref.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(summed, want_summed)  # the rounded sum is exact
    assert rel(normed, want_normed) < TOL[dtype]
    plain, _ = add_norm_cuda.add_rms_norm(x, None, w, 1e-6)
    assert rel(plain, add_norm_ref.add_rms_norm(x, None, w, 1e-6)[0]) < TOL[dtype]


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16], ids=["keep", "bf16-out"])
@pytest.mark.parametrize("rows,n", [(48, 128), (384, 128), (6, 16)])
def test_gated_rms_norm(x_dtype, out_dtype, rows: int, n: int, gen: torch.Generator) -> None:
    x = torch.randn(rows, n, device="cuda", generator=gen).to(x_dtype)
    z = torch.randn(rows, n, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
    got = gated_cuda.gated_rms_norm(x, z, w, 1e-6, out_dtype)
    want = gated_ref.gated_rms_norm(x, z, w, 1e-6, out_dtype)
    assert got.dtype == want.dtype
    assert rel(got, want) < TOL[want.dtype]


@pytest.mark.parametrize("tokens,heads,n", [(2, 48, 128), (8, 48, 128), (3, 6, 16)])
def test_gated_rms_norm_reads_a_strided_gate(tokens: int, heads: int, n: int, gen) -> None:
    """z as a column slice of the fused DeltaNet projection, read in place (at least two tokens:
    a one-row slice is contiguous, and the contiguous case is test_gated_rms_norm's)."""
    proj = torch.randn(tokens, 3 * heads * n + 7, device="cuda", generator=gen).to(torch.bfloat16)
    z = proj[:, heads * n : 2 * heads * n].view(tokens, heads, n)
    assert not z.is_contiguous()
    x = torch.randn(tokens, heads, n, device="cuda", generator=gen)
    w = torch.randn(n, device="cuda", generator=gen).to(torch.bfloat16)
    got = gated_cuda.gated_rms_norm(x, z, w, 1e-6, torch.bfloat16)
    want = gated_ref.gated_rms_norm(x, z.contiguous(), w, 1e-6, torch.bfloat16)
    assert rel(got, want) < 1e-2


def _delta_case(gen, b, hk, hv, dk, dv, q_dtype, v_dtype, strided_v):
    q = torch.nn.functional.normalize(torch.randn(b, hk, dk, device="cuda", generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(b, hk, dk, device="cuda", generator=gen), dim=-1)
    if strided_v:  # a view into a fused projection row, as the model passes it
        fused = torch.randn(b, 2 * hk * dk + hv * dv, device="cuda", generator=gen).to(v_dtype)
        v = fused[:, 2 * hk * dk :].view(b, hv, dv)
    else:
        v = torch.randn(b, hv, dv, device="cuda", generator=gen).to(v_dtype)
    decay = -torch.rand(b, hv, device="cuda", generator=gen) * 3
    beta = torch.rand(b, hv, device="cuda", generator=gen)
    num_slots = b + 3
    state = torch.randn(num_slots, hv, dk, dv, device="cuda", generator=gen) * 0.5
    slots = torch.randperm(num_slots, device="cuda", generator=gen)[:b]
    unused = sorted(set(range(num_slots)) - set(slots.tolist()))
    state[unused] = float("nan")
    return q.to(q_dtype), k.to(q_dtype), v, decay, beta, state, slots, unused


@pytest.mark.parametrize(
    "b,hk,hv,dk,dv",
    [(1, 16, 48, 128, 128), (8, 16, 48, 128, 128), (3, 16, 32, 128, 128), (5, 2, 6, 16, 16)],
    ids=["27b-b1", "27b-b8", "35b-b3", "tiny-b5"],
)
@pytest.mark.parametrize("q_dtype", DTYPES)
@pytest.mark.parametrize("strided_v", [False, True], ids=["dense-v", "strided-v"])
def test_gated_delta_decode(b, hk, hv, dk, dv, q_dtype, strided_v, gen) -> None:
    _check_delta_decode(gen, b, hk, hv, dk, dv, q_dtype, strided_v, "auto")


@pytest.mark.parametrize(
    "b,hk,hv,dk,dv",
    [(1, 16, 48, 128, 128), (64, 16, 48, 128, 128), (17, 16, 32, 128, 128), (6, 2, 4, 16, 256)],
    ids=["27b-b1", "27b-b64", "35b-b17", "tiny-dk16-dv256"],
)
@pytest.mark.parametrize("variant", ["narrow", "wide"])
@pytest.mark.parametrize("strided_v", [False, True], ids=["dense-v", "strided-v"])
def test_gated_delta_decode_variants(b, hk, hv, dk, dv, variant, strided_v, gen) -> None:
    """Both kernels at batch sizes where `auto` would not pick them."""
    _check_delta_decode(gen, b, hk, hv, dk, dv, torch.bfloat16, strided_v, variant)


def _check_delta_decode(gen, b, hk, hv, dk, dv, q_dtype, strided_v, variant) -> None:
    q, k, v, decay, beta, state, slots, unused = _delta_case(
        gen, b, hk, hv, dk, dv, q_dtype, torch.bfloat16, strided_v
    )
    before = state.clone()
    ref_state = state.clone()
    want = delta_ref.gated_delta_rule_decode(q, k, v, decay, beta, ref_state, slots, scale=dk**-0.5)
    got = delta_cuda.gated_delta_rule_decode(
        q, k, v, decay, beta, state, slots, scale=dk**-0.5, variant=variant
    )
    assert got.dtype == torch.float32
    assert rel(got, want) < 1e-4
    assert rel(state[slots], ref_state[slots]) < 1e-4
    assert torch.equal(state[unused].isnan(), before[unused].isnan())  # untouched slots


@pytest.mark.parametrize(
    "b,hk,hv,dk,dv",
    [(1, 16, 48, 128, 128), (8, 16, 48, 128, 128), (3, 16, 32, 128, 128), (5, 2, 6, 16, 8)],
    ids=["27b-b1", "27b-b8", "35b-b3", "tiny-b5"],
)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fused", [False, True], ids=["separate", "fused-proj"])
def test_gdn_decode_front(b, hk, hv, dk, dv, dtype, fused, gen) -> None:
    channels = 2 * hk * dk + hv * dv
    if fused:  # qkv, z, b, a as column slices of one projection output, as the model passes them
        proj = torch.randn(b, channels + hv * dv + 2 * hv, device="cuda", generator=gen).to(dtype)
        qkv, _, bb, a = proj.split((channels, hv * dv, hv, hv), dim=-1)
    else:
        qkv = torch.randn(b, channels, device="cuda", generator=gen).to(dtype)
        a = torch.randn(b, hv, device="cuda", generator=gen).to(dtype)
        bb = torch.randn(b, hv, device="cuda", generator=gen).to(dtype)
    conv_w = (torch.randn(channels, 4, device="cuda", generator=gen) * 0.5).to(dtype)
    a_log = torch.randn(hv, device="cuda", generator=gen)
    dt_bias = torch.randn(hv, device="cuda", generator=gen)
    num_slots = b + 3
    state = torch.randn(num_slots, channels, 3, device="cuda", generator=gen).to(dtype)
    slots = torch.randperm(num_slots, device="cuda", generator=gen)[:b]
    unused = sorted(set(range(num_slots)) - set(slots.tolist()))
    state[unused] = float("nan")
    ref_state = state.clone()
    args = (qkv, a, bb, conv_w, a_log, dt_bias)
    kw = {"num_k_heads": hk, "head_k_dim": dk}
    want = front_ref.gdn_decode_front(*args, ref_state, slots, **kw)
    got = front_cuda.gdn_decode_front(*args, state, slots, **kw)
    assert torch.equal(state[slots], ref_state[slots])  # the shifted window is copied exactly
    assert state[unused].isnan().all()
    tol = TOL[dtype]
    for name, x, y in zip(want._fields, got, want, strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype, name
        assert rel(x, y) < (1e-4 if name in ("g", "beta") else tol), name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,inter", [(1, 17408), (8, 17408), (5, 512), (3, 24)])
def test_silu_mul(dtype: torch.dtype, rows: int, inter: int, gen: torch.Generator) -> None:
    wide = torch.randn(rows, 2 * inter + 16, device="cuda", generator=gen).to(dtype) * 3
    for gate_up in (wide[:, : 2 * inter].contiguous(), wide[:, : 2 * inter]):  # dense, strided
        got = silu_mul_cuda.silu_mul(gate_up)
        assert got.shape == (rows, inter)
        assert rel(got, silu_mul_ref.silu_mul(gate_up)) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "tokens,top_k,n,k",
    [(1, 8, 1024, 2048), (1, 8, 2048, 512), (8, 8, 1024, 2048), (3, 2, 40, 24)],
    ids=["35b-gate-up", "35b-down", "35b-gate-up-b8", "tiny-odd-rows"],
)
def test_expert_gemv(dtype, tokens: int, top_k: int, n: int, k: int, gen) -> None:
    num_experts = 16
    weight = (torch.randn(num_experts, n, k, device="cuda", generator=gen) * 0.05).to(dtype)
    x = torch.randn(tokens, k, device="cuda", generator=gen).to(dtype)
    ids = torch.randint(0, num_experts, (tokens * top_k,), device="cuda", generator=gen)
    for rows_per_input, inputs in ((top_k, x), (1, x.repeat_interleave(top_k, dim=0))):
        assert expert_cuda.supports(inputs, weight)
        got = expert_cuda.expert_gemv(inputs, weight, ids, rows_per_input=rows_per_input)
        want = expert_ref.expert_gemv(inputs, weight, ids, rows_per_input=rows_per_input)
        assert got.shape == want.shape == (tokens * top_k, n)
        assert rel(got, want) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "lens,hq,hk,d,page",
    [
        ((1025,), 24, 4, 256, 64),
        ((700, 1, 64, 3000, 5, 129, 1024, 17), 24, 4, 256, 64),
        ((32768,), 24, 4, 256, 64),
        ((300, 9), 16, 2, 256, 64),
        ((50, 7, 33), 4, 2, 64, 16),
    ],
    ids=["27b-b1-1k", "27b-b8-mixed", "27b-32k", "35b-b2", "tiny"],
)
def test_paged_decode_attention(dtype, lens, hq, hk, d, page, gen) -> None:
    """Shuffled pages, tables wider than the lengths (graph buckets), stale data everywhere."""
    width = -(-max(lens) // page) + 3
    num_pages = len(lens) * width
    k_pages = torch.randn(num_pages, page, hk, d, device="cuda", generator=gen).to(dtype)
    v_pages = torch.randn(num_pages, page, hk, d, device="cuda", generator=gen).to(dtype)
    order = torch.randperm(num_pages, device="cuda", generator=gen)
    table = order.view(len(lens), width)
    kv_lens = torch.tensor(lens, device="cuda")
    q = torch.randn(len(lens), hq, d, device="cuda", generator=gen).to(dtype)
    assert paged_cuda.supports(q, k_pages)
    got = paged_cuda.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=d**-0.5)
    want = paged_ref.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=d**-0.5)
    assert rel(got, want) < TOL[dtype]


@pytest.mark.parametrize(
    "lens,hq,hk,d",
    [((1025,), 24, 4, 256), ((700, 1, 64, 3000, 5, 129, 1024, 17), 24, 4, 256),
     ((32768,), 24, 4, 256), ((300, 9), 16, 2, 256), ((50, 7, 33), 4, 2, 64)],
    ids=["27b-b1-1k", "27b-b8-mixed", "27b-32k", "35b-b2", "tiny"],
)  # fmt: skip
def test_paged_decode_tensor_cores_match_cuda_cores(lens, hq, hk, d, gen) -> None:
    """bf16 pages: the mma partial (p rounded to bf16 for the P.V product) against the CUDA-core
    partial (fp32 p) and the twin, < 1e-2 relative each; both in a graph replay equal eager."""
    page = 64
    width = -(-max(lens) // page) + 2
    num_pages = len(lens) * width
    k_pages = torch.randn(num_pages, page, hk, d, device="cuda", generator=gen).bfloat16()
    v_pages = torch.randn(num_pages, page, hk, d, device="cuda", generator=gen).bfloat16()
    table = torch.randperm(num_pages, device="cuda", generator=gen).view(len(lens), width)
    kv_lens = torch.tensor(lens, device="cuda")
    q = torch.randn(len(lens), hq, d, device="cuda", generator=gen).bfloat16()
    assert paged_cuda.uses_tensor_cores(q, hq // hk, 0, 0)
    args = (q, k_pages, v_pages, table, kv_lens)
    got = paged_cuda.paged_decode_attention(*args, scale=d**-0.5)
    core = paged_cuda.paged_decode_attention(*args, scale=d**-0.5, tensor_cores=False)
    want = paged_ref.paged_decode_attention(*args, scale=d**-0.5)
    assert rel(got, core) < 1e-2 and rel(got, want) < 1e-2
    # two tiles per warp iteration, no V prefetch, the block combine: the same products in the
    # same order, so the same bits
    for variant in ({"mma_tiles": 2}, {"prefetch_v": False}, {"warp_combine": False}):
        again = paged_cuda.paged_decode_attention(*args, scale=d**-0.5, **variant)
        assert torch.equal(again, got), variant
    graph, out = capture_graph(lambda: paged_cuda.paged_decode_attention(*args, scale=d**-0.5))
    q.copy_(torch.randn(q.shape, device="cuda", generator=gen))
    graph.replay()
    assert torch.equal(out, paged_cuda.paged_decode_attention(*args, scale=d**-0.5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "lens,hq,hk,d,split",
    [((2049, 0, 1900, 2048, 1, 257), 16, 2, 256, 256), ((1025,), 24, 4, 256, 64),
     ((300, 9, 4000), 8, 2, 128, 128), ((700, 64, 3), 24, 4, 256, 64)],
    ids=["35b-rows", "27b-b1", "d128-32-splits", "27b-stale-splits"],
)  # fmt: skip
def test_paged_decode_warp_combine_gives_the_block_combines_bits(
    dtype, lens, hq, hk, d, split, gen
) -> None:
    """Plans of at most 32 splits combine one warp per (row, head): bit-equal to the block
    combine (both partial kernels, rows of zero length, splits past the lengths) and < TOL of
    the twin."""
    page = 64
    width = -(-max(lens) // page) + 1
    num_pages = len(lens) * width
    k_pages = torch.randn(num_pages, page, hk, d, device="cuda", generator=gen).to(dtype)
    v_pages = torch.randn(num_pages, page, hk, d, device="cuda", generator=gen).to(dtype)
    table = torch.randperm(num_pages, device="cuda", generator=gen).view(len(lens), width)
    q = torch.randn(len(lens), hq, d, device="cuda", generator=gen).to(dtype)
    args = (q, k_pages, v_pages, table, torch.tensor(lens, device="cuda"))
    assert paged_cuda.uses_warp_combine(-(-width * page // split), d)
    want = paged_ref.paged_decode_attention(*args, scale=d**-0.5)
    for cores in (True, False):
        kw = {"scale": d**-0.5, "tokens_per_split": split, "tensor_cores": cores}
        warp = paged_cuda.paged_decode_attention(*args, **kw)
        block = paged_cuda.paged_decode_attention(*args, warp_combine=False, **kw)
        assert torch.equal(warp, block), cores
        assert rel(warp, want) < TOL[dtype]
    if 0 in lens:
        assert not warp[lens.index(0)].any()  # nothing to attend to: zeros, as the block form


def test_paged_decode_split_cap_matches_the_twin(monkeypatch: pytest.MonkeyPatch, gen) -> None:
    """The split cap (35B-A3B heads, 64 rows at ~2k in a 4k table: the plan's 1,024-token splits
    cut to 256): the same attention as the twin and as the uncapped plan (`NINFER_KERNELS_OFF=
    paged_split_cap`), < 1e-2 relative (other split points: other fp32 partial sums), in a graph
    replay too."""
    page, hq, hk, d = 64, 16, 2, 256
    lens = [2049 - 37 * (i % 5) for i in range(64)]
    width = 64  # the 4,096-token power-of-two bucket a 2k row's graph table gets
    num_pages = len(lens) * 33
    k_pages = torch.randn(num_pages, page, hk, d, device="cuda", generator=gen).bfloat16()
    v_pages = torch.randn(num_pages, page, hk, d, device="cuda", generator=gen).bfloat16()
    table = torch.randperm(num_pages, device="cuda", generator=gen).view(len(lens), 33)
    table = torch.cat((table, table[:, :1].expand(-1, width - 33)), dim=1)  # stale tail pages
    q = torch.randn(len(lens), hq, d, device="cuda", generator=gen).bfloat16()
    args = (q, k_pages, v_pages, table, torch.tensor(lens, device="cuda"))
    plan = paged_cuda.plan_splits(64, hk, hq // hk, width * page, paged_cuda.MMA_MAX_BLOCKS,
                                  width * page // 2)  # fmt: skip
    assert plan.tokens_per_split > paged_cuda.MMA_MAX_SPLIT_TOKENS  # the cap changes this plan
    assert paged_cuda.mma_plan(64, hk, hq // hk, width * page).tokens_per_split == 256
    monkeypatch.setenv("NINFER_KERNELS_OFF", "paged_split_cap")
    uncapped = paged_cuda.paged_decode_attention(*args, scale=d**-0.5)
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    capped = paged_cuda.paged_decode_attention(*args, scale=d**-0.5)
    want = paged_ref.paged_decode_attention(*args, scale=d**-0.5)
    assert rel(capped, want) < 1e-2 and rel(capped, uncapped) < 1e-2
    graph, out = capture_graph(lambda: paged_cuda.paged_decode_attention(*args, scale=d**-0.5))
    graph.replay()
    assert torch.equal(out, capped)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "tokens,hq,hk,d,rotary",
    [(1, 24, 4, 256, 64), (8, 24, 4, 256, 64), (300, 16, 2, 256, 64), (5, 4, 2, 32, 16),
     (3, 4, 2, 96, 32), (4, 4, 2, 256, 8)],
    ids=["27b-b1", "27b-b8", "35b-prefill", "tiny", "d96-block", "rotary8-block"],
)  # fmt: skip
def test_qk_norm_rope(dtype, tokens: int, hq: int, hk: int, d: int, rotary: int, gen) -> None:
    """The warp kernel where `per_warp_dims` takes the shape (the last two ids: the block kernel),
    and the block kernel everywhere, against the twin."""
    width = hq * 2 * d + 2 * hk * d
    proj = torch.randn(tokens, width, device="cuda", generator=gen).to(dtype)
    q = proj[:, : hq * 2 * d].view(tokens, hq, 2, d)[:, :, 0]  # the model's strided views
    k = proj[:, hq * 2 * d : hq * 2 * d + hk * d].view(tokens, hk, d)
    qw = (torch.randn(d, device="cuda", generator=gen) * 0.1).to(dtype)
    kw = (torch.randn(d, device="cuda", generator=gen) * 0.1).to(dtype)
    angles = torch.rand(tokens, rotary // 2, device="cuda", generator=gen) * 1000
    angles = torch.cat((angles, angles), dim=-1)
    cos, sin = angles.cos(), angles.sin()
    assert qk_cuda.supports(q, k, cos)
    assert (qk_cuda.per_warp_dims(d, rotary) is None) == (d == 96 or rotary == 8)
    want = qk_ref.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6)
    for per_warp in (True, False):
        got = qk_cuda.qk_norm_rope(q, k, qw, kw, cos, sin, 1e-6, per_warp=per_warp)
        for x, y in zip(got, want, strict=True):
            assert x.shape == y.shape and x.is_contiguous()
            assert rel(x, y) < TOL[dtype]


def test_kernels_are_recorded_by_a_cuda_graph(gen: torch.Generator) -> None:
    """Launched on torch's current stream, a kernel replays inside torch.cuda.graph."""
    x = torch.randn(4, 512, device="cuda", generator=gen, dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(512, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.1
    dispatch.add_rms_norm(x, r, w, 1e-6)  # compile outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        dispatch.add_rms_norm(x, r, w, 1e-6)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        normed, _ = dispatch.add_rms_norm(x, r, w, 1e-6)
    x.copy_(torch.randn(x.shape, device="cuda", generator=gen))  # new inputs, same buffers
    graph.replay()
    torch.cuda.synchronize()
    assert rel(normed, add_norm_ref.add_rms_norm(x, r, w, 1e-6)[0]) < 1e-2
