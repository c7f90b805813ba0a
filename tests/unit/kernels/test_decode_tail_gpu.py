"""The decode-tail kernels (add_rms_norm, paged decode attention) against their torch twins.

GPU only. Fresh random inputs each run; bf16 outputs within 1e-2 relative, fp32 within 1e-4.
KV positions the attention must not read (past each length, pages outside the live table) are
poisoned with NaN, so reading one shows up as a NaN in the result. Graph replays must equal eager
calls bit for bit (the same kernels, the same plan, no atomics).
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels.add_rms_norm import launch as add_norm_cuda
from ninfer.kernels.add_rms_norm import reference as add_norm_ref
from ninfer.kernels.paged_decode_attention import launch as paged_cuda
from ninfer.kernels.paged_decode_attention import reference as paged_ref
from support.gpu_checks import capture_graph, rel

pytestmark = pytest.mark.gpu
TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-4}
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


# -- add_rms_norm ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rows,n",
    [(1, 5120), (2, 5120), (8, 5120), (1, 2048), (8, 2048), (3, 48), (5, 4100), (2, 40000)],
    ids=["27b-b1", "27b-b2", "27b-b8", "35b-b1", "35b-b8", "tiny", "off-grid", "long-row"],
)
def test_add_rms_norm_matches_the_twin(dtype, rows: int, n: int, gen) -> None:
    x = torch.randn(rows, n, device="cuda", generator=gen).to(dtype)
    r = torch.randn(rows, n, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(n, device="cuda", generator=gen) * 0.1).to(dtype)
    normed, summed = add_norm_cuda.add_rms_norm(x, r, w, 1e-6)
    want_normed, want_summed = add_norm_ref.add_rms_norm(x, r, w, 1e-6)
    assert normed.shape == x.shape and normed.dtype == dtype
    assert torch.equal(summed, want_summed)  # the rounded sum is exact
    assert rel(normed, want_normed) < TOL[dtype]
    plain, same = add_norm_cuda.add_rms_norm(x, None, w, 1e-6)
    assert same is x
    assert rel(plain, add_norm_ref.add_rms_norm(x, None, w, 1e-6)[0]) < TOL[dtype]


def test_add_rms_norm_cases_cover_both_kernels() -> None:
    """The one-pass kernel at the decode rows; the row kernel off the vector grid or too long."""
    assert add_norm_cuda.vec_plan(5120, 2) is not None and add_norm_cuda.vec_plan(48, 2)
    assert add_norm_cuda.vec_plan(4100, 2) is None and add_norm_cuda.vec_plan(40000, 2) is None
    assert add_norm_cuda.vec_plan(4100, 4) is not None  # fp32 4100 = 1025 vectors


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_on_unaligned_rows(dtype, gen) -> None:
    """Views starting off a 16-byte boundary take the row kernel, with the same results."""
    n = 5120
    base = torch.randn(2 * n + 1, device="cuda", generator=gen).to(dtype)
    x = base[1:].view(2, n)  # 2 or 4 bytes past the allocation's start
    r = torch.randn(2, n, device="cuda", generator=gen).to(dtype)
    w = (torch.randn(n, device="cuda", generator=gen) * 0.1).to(dtype)
    assert x.data_ptr() % 16 != 0
    normed, summed = add_norm_cuda.add_rms_norm(x, r, w, 1e-6)
    want_normed, want_summed = add_norm_ref.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(summed, want_summed)
    assert rel(normed, want_normed) < TOL[dtype]
    plain, _ = add_norm_cuda.add_rms_norm(x, None, w, 1e-6)
    assert rel(plain, add_norm_ref.add_rms_norm(x, None, w, 1e-6)[0]) < TOL[dtype]


def test_add_rms_norm_graph_replay_equals_eager(gen) -> None:
    x = torch.randn(1, 5120, device="cuda", generator=gen, dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = (torch.randn(5120, device="cuda", generator=gen) * 0.1).to(torch.bfloat16)
    graph, (normed, summed) = capture_graph(lambda: add_norm_cuda.add_rms_norm(x, r, w, 1e-6))
    for _ in range(2):
        x.copy_(torch.randn(x.shape, device="cuda", generator=gen))  # new inputs, same buffers
        r.copy_(torch.randn(r.shape, device="cuda", generator=gen))
        graph.replay()
        want_normed, want_summed = add_norm_cuda.add_rms_norm(x, r, w, 1e-6)
        assert torch.equal(normed, want_normed) and torch.equal(summed, want_summed)
        assert rel(normed, add_norm_ref.add_rms_norm(x, r, w, 1e-6)[0]) < 1e-2


# -- paged decode attention --------------------------------------------------------------------


def _paged_case(gen, dtype, lens, hq, hk, d, page, *, extra_pages=3, strided_table=False):
    """Shuffled pages, tables wider than the lengths, every unread KV position NaN.

    Returns q, k_pages, v_pages, page_table, kv_lens. The table's padding columns repeat a page
    of the row (as the graphs pad), so they point at live memory the kernel must still ignore.
    """
    num_seqs = len(lens)
    width = -(-max(lens) // page) + extra_pages
    num_pages = num_seqs * width + 2  # two pages no row names
    k_pages = torch.randn(num_pages, page, hk, d, device="cuda", generator=gen).to(dtype)
    v_pages = torch.randn(num_pages, page, hk, d, device="cuda", generator=gen).to(dtype)
    order = torch.randperm(num_pages, device="cuda", generator=gen)
    table = order[: num_seqs * width].view(num_seqs, width).clone()
    live = torch.zeros(num_pages, page, dtype=torch.bool, device="cuda")
    for b, n in enumerate(lens):
        used = -(-n // page)
        table[b, used:] = table[b, 0]
        pos = torch.arange(n, device="cuda")
        live[table[b, pos // page], pos % page] = True
    k_pages[~live] = float("nan")
    v_pages[~live] = float("nan")
    if strided_table:  # a column slice of a wider buffer, as engine/graphs.py passes it
        wide = torch.zeros(num_seqs, width + 5, dtype=torch.int64, device="cuda")
        wide[:, 3 : 3 + width] = table
        table = wide[:, 3 : 3 + width]
        assert not table.is_contiguous()
    kv_lens = torch.tensor(lens, device="cuda")
    q = torch.randn(num_seqs, hq, d, device="cuda", generator=gen).to(dtype)
    return q, k_pages, v_pages, table, kv_lens


MIXED = (1, 17, 1000, 1024, 4096, 32768, 63, 2049)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "lens,hq,hk,d,page",
    [
        ((1000,), 24, 4, 256, 64),
        ((1024,), 24, 4, 256, 64),
        ((32768,), 24, 4, 256, 64),
        (MIXED, 24, 4, 256, 64),
        ((1025,), 16, 2, 256, 64),
        (MIXED, 16, 2, 256, 64),
        ((50, 7, 33), 4, 2, 64, 16),
        ((5, 300, 1), 2, 2, 128, 1),
        ((40000,), 2, 1, 128, 16),
        ((31, 32, 33, 95), 12, 4, 32, 8),
    ],
    ids=[
        "27b-b1-1000",
        "27b-b1-1024",
        "27b-b1-32k",
        "27b-b8-mixed",
        "35b-b1-1k",
        "35b-b8-mixed",
        "tiny",
        "mha-page1",
        "many-splits",
        "split-edges",
    ],
)
def test_paged_decode_matches_the_twin(dtype, lens, hq, hk, d, page, gen) -> None:
    q, k_pages, v_pages, table, kv_lens = _paged_case(gen, dtype, lens, hq, hk, d, page)
    assert paged_cuda.supports(q, k_pages)
    got = paged_cuda.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=d**-0.5)
    want = paged_ref.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=d**-0.5)
    assert got.shape == want.shape and got.dtype == dtype
    assert not want.isnan().any()  # the twin too reads live positions only
    for b in range(len(lens)):  # every row, so a short sequence cannot hide behind a long one
        assert rel(got[b], want[b]) < TOL[dtype], f"row {b} (len {lens[b]})"


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_decode_reads_a_strided_table(dtype, gen) -> None:
    lens = (700, 1, 64, 3000)
    q, k_pages, v_pages, table, kv_lens = _paged_case(
        gen, dtype, lens, 24, 4, 256, 64, strided_table=True
    )
    got = paged_cuda.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=0.0625)
    want = paged_ref.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=0.0625)
    assert rel(got, want) < TOL[dtype]


def test_paged_decode_graph_replay_equals_eager(gen) -> None:
    """Captured once for a table width; replayed for other lengths and contents within it."""
    dtype, page = torch.bfloat16, 64
    q, k_pages, v_pages, table, kv_lens = _paged_case(
        gen, dtype, (900, 17, 2048, 1), 24, 4, 256, page, extra_pages=0, strided_table=True
    )
    graph, out = capture_graph(
        lambda: paged_cuda.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=0.0625)
    )
    for lens in ((1, 2048, 33, 1000), (2048, 2048, 2048, 2048), (64, 65, 1, 129)):
        kv_lens.copy_(torch.tensor(lens))
        q.copy_(torch.randn(q.shape, device="cuda", generator=gen))
        k_pages.copy_(torch.randn(k_pages.shape, device="cuda", generator=gen))
        v_pages.copy_(torch.randn(v_pages.shape, device="cuda", generator=gen))
        graph.replay()
        eager = paged_cuda.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=0.0625)
        assert torch.equal(out, eager)
        want = paged_ref.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, scale=0.0625)
        assert rel(out, want) < 1e-2


@pytest.mark.parametrize("warp_combine", [True, False], ids=["warp-combine", "block-combine"])
@pytest.mark.parametrize(
    "lens,hq,hk,d",
    [((1000,), 24, 4, 256), (MIXED, 24, 4, 256), ((50, 7, 33), 4, 2, 64)],
    ids=["27b-b1", "27b-b8-mixed", "tiny"],
)
def test_gated_combine_is_sigmoid_gate_after_bit_for_bit(
    warp_combine: bool, lens, hq, hk, d, gen
) -> None:
    """The combine's output gate (`dispatch.gate_in_combine`) with a strided gate view, as the
    gated attention slices it from its q projection ([T, Hq, 2, D] at 1): exactly the bits of the
    sigmoid_gate kernel on the ungated result; the ungated output is unchanged by the option."""
    from ninfer.kernels import dispatch

    q, k_pages, v_pages, table, kv_lens = _paged_case(gen, torch.bfloat16, lens, hq, hk, d, 64)
    qg = (torch.randn(len(lens), hq, 2, d, device="cuda", generator=gen) * 4).to(torch.bfloat16)
    gate = qg[:, :, 1]
    assert paged_cuda.gate_problem(q, gate) is None
    kw = {"scale": d**-0.5, "warp_combine": warp_combine}
    plain = paged_cuda.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, **kw)
    gated = paged_cuda.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, gate=gate, **kw)
    assert torch.equal(gated.view(len(lens), -1), dispatch.sigmoid_gate(plain, gate))
    again = paged_cuda.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, **kw)
    assert torch.equal(again, plain)
    graph, out = capture_graph(
        lambda: paged_cuda.paged_decode_attention(
            q, k_pages, v_pages, table, kv_lens, gate=gate, **kw
        )
    )
    qg.copy_(torch.randn(qg.shape, device="cuda", generator=gen))
    q.copy_(torch.randn(q.shape, device="cuda", generator=gen))
    graph.replay()
    plain = paged_cuda.paged_decode_attention(q, k_pages, v_pages, table, kv_lens, **kw)
    assert torch.equal(out.view(len(lens), -1), dispatch.sigmoid_gate(plain, gate))


def test_gated_combine_refuses_what_it_cannot_gate(gen) -> None:
    q, k_pages, v_pages, table, kv_lens = _paged_case(gen, torch.bfloat16, (10,), 4, 2, 64, 16)
    assert "does not match" in paged_cuda.gate_problem(q, q[:, :2])
    assert "dense head dims" in paged_cuda.gate_problem(
        q, q.transpose(0, 2).contiguous().transpose(0, 2)
    )
    assert "bf16 only" in paged_cuda.gate_problem(q.float(), q.float())
    with pytest.raises(paged_cuda.rt.KernelInputError, match="output gate"):
        paged_cuda.paged_decode_attention(
            q, k_pages, v_pages, table, kv_lens, scale=0.125, gate=q[:, :2]
        )
