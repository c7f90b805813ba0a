"""The sigmoid-gate kernel against the eager torch ops on the GPU.

The kernel rounds as the eager ops do (sigmoid to bf16, then the product) but with the fast exp,
so an element may land one bf16 ulp from torch's where the exact value sits at a rounding
boundary: the tests allow at most 1 % of the elements to differ and each by at most one ulp
(2^-7 of the value's magnitude).
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch
from ninfer.kernels.sigmoid_gate import launch as gate_cuda
from support.gpu_checks import capture_graph

pytestmark = pytest.mark.gpu


def _close_to_eager(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
    diff = got != want
    assert diff.float().mean().item() <= 0.01
    err = (got.float() - want.float()).abs()[diff]
    assert (err <= want.float().abs()[diff] * 2**-7).all()


@pytest.mark.parametrize(
    "tokens,heads,head_dim",
    [(1, 24, 256), (8, 16, 256), (8192, 24, 256), (70_000, 2, 8), (3, 5, 104)],
)
def test_matches_the_eager_ops_on_strided_views(tokens: int, heads: int, head_dim: int, gen):
    """o head-major (as SDPA returns it transposed), the gate a slice of a [T, H, 2, D] q
    projection: both strided, as in the model; 70,000 rows exercise the grid-y loop."""
    o = torch.randn(heads, tokens, head_dim, device="cuda", generator=gen)
    o = o.to(torch.bfloat16).transpose(0, 1)
    qg = torch.randn(tokens, heads, 2, head_dim, device="cuda", generator=gen) * 4
    gate = qg.to(torch.bfloat16)[:, :, 1]
    assert gate_cuda.supports(o, gate)
    want = (o * torch.sigmoid(gate)).reshape(tokens, -1)
    _close_to_eager(gate_cuda.sigmoid_gate(o, gate), want)


def test_dispatch_takes_the_kernel_in_a_graph(gen, monkeypatch) -> None:
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    o = torch.randn(8, 24, 256, device="cuda", generator=gen).to(torch.bfloat16)
    gate = torch.randn(8, 24, 2, 256, device="cuda", generator=gen).to(torch.bfloat16)[:, :, 1]
    eager = dispatch.sigmoid_gate(o, gate)
    graph, out = capture_graph(lambda: dispatch.sigmoid_gate(o, gate))
    graph.replay()
    assert torch.equal(out, eager)
    _close_to_eager(eager, (o * torch.sigmoid(gate)).reshape(8, -1))
    monkeypatch.setenv("NINFER_KERNELS_OFF", "sigmoid_gate")
    assert torch.equal(dispatch.sigmoid_gate(o, gate), (o * torch.sigmoid(gate)).reshape(8, -1))
    # fp32 (a test model's dtype) always takes the twin
    assert torch.equal(
        dispatch.sigmoid_gate(o.float(), gate.float()),
        (o.float() * torch.sigmoid(gate.float())).reshape(8, -1),
    )
