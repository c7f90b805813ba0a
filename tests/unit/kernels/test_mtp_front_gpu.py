"""The MTP front kernel (GPU): [rms_norm(embed[ids]) | rms_norm(hidden)] in one launch must give
exactly the bits of dispatch's four launches (the embedding gather, two add_rms_norm kernels, the
concatenation), for row counts of a draft step to a batched verify, for the norm's shapes at the
27B's and 35B-A3B's widths and a tiny one, with a strided hidden view, and in a graph replay."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch, switches
from ninfer.kernels.mtp_front import launch as front_cuda
from support.gpu_checks import capture_graph

pytestmark = pytest.mark.gpu
EPS = 1e-6


def _operands(rows: int, n: int, gen: torch.Generator, vocab: int = 1000):
    ids = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
    embed = torch.randn(vocab, n, device="cuda", generator=gen).to(torch.bfloat16)
    hidden = (torch.randn(rows, n, device="cuda", generator=gen) * 4).to(torch.bfloat16)
    norms = [(torch.randn(n, device="cuda", generator=gen) * 0.3).to(torch.bfloat16) for _ in "ab"]
    return ids, embed, hidden, *norms


def _unfused(ids, embed, hidden, embed_norm, hidden_norm) -> torch.Tensor:
    """dispatch's four launches (`mtp_front` switched off)."""
    with switches.setting("NINFER_KERNELS_OFF", "mtp_front"):
        return dispatch.mtp_front(ids, embed, hidden, embed_norm, hidden_norm, EPS)


@pytest.mark.parametrize("rows", [1, 4, 8, 32])
@pytest.mark.parametrize("n", [5120, 2048, 64])
def test_mtp_front_is_the_four_launches_bit_for_bit(rows, n, gen, monkeypatch) -> None:
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    args = _operands(rows, n, gen)
    assert front_cuda.problem(*args) is None
    want = _unfused(*args)
    got = front_cuda.mtp_front(*args, EPS)
    assert got.shape == (rows, 2 * n) and torch.equal(got, want)
    assert torch.equal(dispatch.mtp_front(*args, EPS), want)  # the default route


def test_mtp_front_strided_hidden_and_graph(gen) -> None:
    ids, embed, hidden, embed_norm, hidden_norm = _operands(4, 5120, gen)
    wide = torch.randn(4, 5120 + 64, device="cuda", generator=gen).to(torch.bfloat16)
    view = wide[:, 64:]  # rows 10,368 bytes apart
    assert front_cuda.problem(ids, embed, view, embed_norm, hidden_norm) is None
    want = _unfused(ids, embed, view, embed_norm, hidden_norm)
    assert torch.equal(front_cuda.mtp_front(ids, embed, view, embed_norm, hidden_norm, EPS), want)
    graph, out = capture_graph(
        lambda: front_cuda.mtp_front(ids, embed, view, embed_norm, hidden_norm, EPS)
    )
    ids.copy_(torch.randint(0, 1000, (4,), device="cuda", generator=gen))
    wide.copy_(torch.randn(4, 5120 + 64, device="cuda", generator=gen).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, _unfused(ids, embed, view, embed_norm, hidden_norm))
