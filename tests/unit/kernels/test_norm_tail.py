"""The deferred projection (`dispatch.project` / `dispatch.Pending`) off the GPU: nothing is
deferred on the CPU, even switched on, and a `Pending` handed to `add_rms_norm` is projected and
normed exactly as the two calls are (the fallback whenever the norm tail does not take it)."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [True, False], ids=["add", "norm"])
def test_pending_is_projected_then_normed(dtype, with_residual, monkeypatch) -> None:
    monkeypatch.setenv("NINFER_KERNELS_ON", "gemv_norm_tail")
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(3, 48, generator=gen).to(dtype)
    w = (torch.randn(40, 48, generator=gen) * 0.2).to(dtype)
    residual = torch.randn(3, 40, generator=gen).to(dtype) if with_residual else None
    norm_weight = (torch.randn(40, generator=gen) * 0.1).to(dtype)
    projected = dispatch.project(x, w, defer=True)
    assert isinstance(projected, torch.Tensor)  # the CPU defers nothing
    assert not dispatch.norm_tail_routed(x, w)
    want = dispatch.add_rms_norm(dispatch.linear(x, w), residual, norm_weight, 1e-6)
    got = dispatch.add_rms_norm(dispatch.Pending(x, w), residual, norm_weight, 1e-6)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(projected, dispatch.linear(x, w))
