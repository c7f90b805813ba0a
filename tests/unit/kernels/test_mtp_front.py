"""The MTP front off the GPU: dispatch's composition is the twin's, bit for bit (fp32 and bf16),
and the launcher's operand check names what it refuses."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch
from ninfer.kernels.mtp_front import launch as front_cuda
from ninfer.kernels.mtp_front.reference import mtp_front


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dispatch_is_the_twin(dtype) -> None:
    """No CUDA: dispatch runs the composition."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 50, (5,), generator=gen)
    embed = torch.randn(50, 32, generator=gen).to(dtype)
    hidden = torch.randn(5, 32, generator=gen).to(dtype)
    norms = [torch.randn(32, generator=gen).to(dtype) * 0.2 for _ in "ab"]
    got = dispatch.mtp_front(ids, embed, hidden, *norms, 1e-6)
    assert got.shape == (5, 64)
    assert torch.equal(got, mtp_front(ids, embed, hidden, *norms, 1e-6))
    # each half is the norm of its own input: an id changes only the first half of its row
    ids2 = ids.clone()
    ids2[2] = (ids[2] + 1) % 50
    again = dispatch.mtp_front(ids2, embed, hidden, *norms, 1e-6)
    assert torch.equal(again[:, 32:], got[:, 32:]) and not torch.equal(again[2, :32], got[2, :32])


def test_problem_names_the_operand() -> None:
    ids = torch.zeros(2, dtype=torch.int64)
    embed, hidden, norm = torch.zeros(9, 16), torch.zeros(2, 16), torch.zeros(16)
    assert "bf16" in front_cuda.problem(ids, embed, hidden, norm, norm)
    b = torch.bfloat16
    assert "int64" in front_cuda.problem(
        ids.int(), embed.to(b), hidden.to(b), norm.to(b), norm.to(b)
    )
    assert "hidden" in front_cuda.problem(
        ids, embed.to(b), hidden[:1].to(b), norm.to(b), norm.to(b)
    )
    odd = torch.zeros(9, 12, dtype=b)
    assert "one-pass" in front_cuda.problem(
        ids, odd, torch.zeros(2, 12, dtype=b), torch.zeros(12, dtype=b), torch.zeros(12, dtype=b)
    )
