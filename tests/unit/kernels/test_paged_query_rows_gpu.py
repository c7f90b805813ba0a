"""The paged decode attention's W queries per table row (a speculative verify's W tokens of one
sequence, each with its own causal length) in one tensor-core block (GPU only).

At one split size a query's result must be the bits of the same query with its own copy of the
table row (the per-query launch the verify ran before), since each output element is the same
mma lane arithmetic over the same k order; against the fp32 twin < 1e-2 relative (bf16 p in the
P.V product). Lengths cross split boundaries, rows end at different splits, a row may be empty.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch
from ninfer.kernels.kv_quant import formats as kvf
from ninfer.kernels.kv_quant import reference as kv_ref
from ninfer.kernels.paged_decode_attention import launch as paged_cuda
from ninfer.kernels.paged_decode_attention import reference as paged_ref
from support.gpu_checks import capture_graph, rel

pytestmark = pytest.mark.gpu
PAGE = 64


def _pages(gen: torch.Generator, num_pages: int, hk: int, d: int, fmt: str):
    base = torch.randn(num_pages, PAGE, hk, d, device="cuda", generator=gen).bfloat16()
    if fmt == kvf.PLAIN:
        return base
    values, scale, blocks = kv_ref.quantize(base, fmt)
    return kvf.QuantPages(fmt, values, scale, blocks)


def _case(gen, bases, width, hq, hk, d, fmt, extra_pages=3):
    """Sequences whose `width` queries end at base + 1 .. base + width, shuffled pages, tables
    wider than the lengths (graph buckets)."""
    cols = -(-(max(bases) + width) // PAGE) + extra_pages
    num_pages = len(bases) * cols
    k_pages = _pages(gen, num_pages, hk, d, fmt)
    v_pages = _pages(gen, num_pages, hk, d, fmt)
    table = torch.randperm(num_pages, device="cuda", generator=gen).view(len(bases), cols)
    lens = torch.tensor([b + j + 1 for b in bases for j in range(width)], device="cuda")
    q = torch.randn(len(bases) * width, hq, d, device="cuda", generator=gen).bfloat16()
    return q, k_pages, v_pages, table, lens


CASES = [
    pytest.param((1023,), 4, 24, 4, 256, id="27b-b1-1k-w4"),
    pytest.param((62, 127, 5, 3000), 4, 24, 4, 256, id="27b-b4-across-splits-w4"),
    pytest.param((700, 33), 5, 24, 4, 256, id="27b-w5"),
    pytest.param((1023, 64), 2, 24, 4, 256, id="27b-w2"),
    pytest.param((2040, 500, 9), 4, 16, 2, 256, id="35b-w4"),
    pytest.param((0, 40, 95), 6, 4, 2, 64, id="tiny-w6"),
]


@pytest.mark.parametrize("fmt", [kvf.PLAIN, kvf.FP8, kvf.INT8])
@pytest.mark.parametrize("bases,width,hq,hk,d", CASES)
def test_query_rows_give_the_per_query_bits(bases, width, hq, hk, d, fmt, gen) -> None:
    if fmt != kvf.PLAIN and d % 128:
        pytest.skip("8-bit codes on tensor cores need D a multiple of 128")
    q, k_pages, v_pages, table, lens = _case(gen, bases, width, hq, hk, d, fmt)
    group = hq // hk
    code = paged_cuda.FORMAT_CODES[fmt]
    assert paged_cuda.groups_queries(q, group, width, code, code)
    scale = d**-0.5
    per_query = table.repeat_interleave(width, dim=0)
    want = paged_ref.paged_decode_attention(q, k_pages, v_pages, per_query, lens, scale=scale)
    for split in (32, 64, 256):
        if split * group * width > paged_cuda.SCORE_FLOATS:
            continue
        kw = {"scale": scale, "tokens_per_split": split}
        grouped = paged_cuda.paged_decode_attention(
            q, k_pages, v_pages, table, lens, queries_per_row=width, **kw
        )
        single = paged_cuda.paged_decode_attention(q, k_pages, v_pages, per_query, lens, **kw)
        assert torch.equal(grouped, single), split
        assert rel(grouped, want) < 1e-2, split
    auto = paged_cuda.paged_decode_attention(
        q, k_pages, v_pages, table, lens, scale=scale, queries_per_row=width
    )
    assert rel(auto, want) < 1e-2


def test_query_rows_take_any_lengths_and_replay_in_a_graph(gen) -> None:
    """Lengths need not be causal (a row of 0, a shorter later row): each query still reads only
    its own; a graph captured once replays for new q and lengths within the table."""
    q, k_pages, v_pages, table, _ = _case(gen, (900, 300), 4, 24, 4, 256, kvf.PLAIN)
    lens = torch.tensor([901, 0, 64, 65, 33, 300, 1, 299], device="cuda")
    args = (q, k_pages, v_pages, table, lens)
    per_query = table.repeat_interleave(4, dim=0)
    scale = 256**-0.5

    def grouped():
        return paged_cuda.paged_decode_attention(*args, scale=scale, queries_per_row=4)

    got = grouped()
    want = paged_ref.paged_decode_attention(q, k_pages, v_pages, per_query, lens, scale=scale)
    assert rel(got, want) < 1e-2
    assert not got[1].any()  # nothing to attend to: zeros, as the per-query launch gives
    graph, out = capture_graph(grouped)
    q.copy_(torch.randn(q.shape, device="cuda", generator=gen))
    lens.copy_(torch.tensor([5, 6, 700, 701, 299, 300, 128, 129], device="cuda"))
    graph.replay()
    assert torch.equal(out, grouped())


def test_too_many_rows_repeat_the_table_and_the_switch_restores_per_query_blocks(
    monkeypatch: pytest.MonkeyPatch, gen
) -> None:
    """W x G above MMA_MAX_QUERY_ROWS (27B heads, W = 6: 36 rows) runs one block per query with
    repeated table rows, the same bits as that launch; `NINFER_KERNELS_OFF=paged_query_rows`
    makes dispatch do the same for any W."""
    q, k_pages, v_pages, table, lens = _case(gen, (500, 70), 6, 24, 4, 256, kvf.PLAIN)
    assert not paged_cuda.groups_queries(q, 6, 6, 0, 0)
    per_query = table.repeat_interleave(6, dim=0)
    scale = 256**-0.5
    got = paged_cuda.paged_decode_attention(
        q, k_pages, v_pages, table, lens, scale=scale, queries_per_row=6
    )
    single = paged_cuda.paged_decode_attention(q, k_pages, v_pages, per_query, lens, scale=scale)
    assert torch.equal(got, single)
    q4, k4, v4, table4, lens4 = _case(gen, (500, 70), 4, 24, 4, 256, kvf.PLAIN)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "paged_query_rows")
    off = dispatch.paged_decode_attention(q4, k4, v4, table4, lens4, scale=scale, queries_per_row=4)
    single4 = paged_cuda.paged_decode_attention(
        q4, k4, v4, table4.repeat_interleave(4, dim=0), lens4, scale=scale
    )
    assert torch.equal(off, single4)
