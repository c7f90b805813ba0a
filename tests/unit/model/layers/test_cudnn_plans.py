"""The cuDNN attention calls hand torch BSHD operands, the layout whose plans torch keys on
power-of-two bounds instead of exact lengths (with TORCH_CUDNN_SDPA_AVOID_RECOMPILE, which the
module sets unless the caller did). The op itself is replaced by a recorder: the CPU has no
cuDNN, and what is checked is what reaches it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from ninfer.model.layers import gated_attention, split_attention
from ninfer.model.layers.cudnn_plans import AVOID_RECOMPILE, bshd_heads
from ninfer.model.layers.split_attention import split_prefix_attention


def _is_bshd(x: torch.Tensor) -> bool:
    return x.dim() == 4 and x.transpose(1, 2).is_contiguous()


def test_bshd_heads_copies_only_strided_inputs():
    fused = torch.randn(7, 3 * 2 * 8)  # [T, (q, k, v) x H x D], as a fused projection
    v = fused[:, 32:].reshape(7, 2, 8)
    assert not v.is_contiguous()
    out = bshd_heads(v)
    assert out.shape == (1, 2, 7, 8) and _is_bshd(out) and torch.equal(out[0].transpose(0, 1), v)
    k = torch.randn(7, 2, 8)
    assert bshd_heads(k).data_ptr() == k.data_ptr()  # already T-major: a view


def test_split_attention_hands_cudnn_bshd_operands(monkeypatch: pytest.MonkeyPatch):
    seen = []

    def recorder(q, k, v, bias, lse, dropout, is_causal, debug, *, scale):
        seen.append((q, k, v, bias, is_causal))
        n, h = q.shape[2], q.shape[1]
        return torch.zeros_like(q), torch.zeros(1, h, n, 1)

    monkeypatch.setattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", recorder)
    fused = torch.randn(12, (6 + 2 + 2) * 8)
    q = fused[:4, :48].reshape(4, 6, 8)  # strided views, as the layer's projections give
    k = fused[:, 48:64].reshape(12, 2, 8)
    v = fused[:, 64:].reshape(12, 2, 8)
    split_attention._cudnn_call(q, k[:8], v[:8], scale=1.0, is_causal=False, expand=False)
    split_attention._cudnn_call(q, k[8:], v[8:], scale=1.0, is_causal=True, expand=True)
    assert len(seen) == 2
    for args in seen:
        assert all(_is_bshd(t) for t in args[:3]) and args[3] is None
    assert [a[4] for a in seen] == [False, True]


def test_grouped_sdpa_hands_bshd_operands(monkeypatch: pytest.MonkeyPatch):
    seen = []

    def recorder(q, k, v, **kwargs):
        seen.append((q, k, v))
        return torch.zeros_like(q)

    monkeypatch.setattr(gated_attention.F, "scaled_dot_product_attention", recorder)
    fused = torch.randn(5, (4 + 2 + 2) * 8)
    q = fused[:, :32].reshape(5, 4, 8)
    k = fused[:, 32:48].reshape(5, 2, 8)
    v = fused[:, 48:].reshape(5, 2, 8)
    out = gated_attention._sdpa_grouped(q, k, v, scale=1.0, is_causal=True)
    assert out.shape == q.shape
    assert all(_is_bshd(t) for t in seen[0])


def test_import_sets_avoid_recompile_unless_the_caller_did():
    code = "import os, ninfer.model.layers.cudnn_plans; print(os.environ['{0}'])"
    env = {k: v for k, v in os.environ.items() if k != AVOID_RECOMPILE}
    run = subprocess.run([sys.executable, "-c", code.format(AVOID_RECOMPILE)], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert run.stdout.strip() == "1"
    env[AVOID_RECOMPILE] = "0"
    run = subprocess.run([sys.executable, "-c", code.format(AVOID_RECOMPILE)], env=env,
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert run.stdout.strip() == "0"


def _record_variants(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    ran: list[str] = []
    real_fresh, real_split = gated_attention.fresh_causal_attention, split_prefix_attention
    monkeypatch.setattr(
        gated_attention, "fresh_causal_attention",
        lambda *a, **kw: ran.append("fresh") or real_fresh(*a, **kw),
    )  # fmt: skip
    monkeypatch.setattr(
        gated_attention, "split_prefix_attention",
        lambda *a, **kw: ran.append("split") or real_split(*a, **kw),
    )  # fmt: skip
    return ran


def test_warm_up_is_a_no_op_off_cuda(monkeypatch: pytest.MonkeyPatch):
    ran = _record_variants(monkeypatch)
    gated_attention.warm_prefill_attention(4, 2, 8, dtype=torch.float32, device=torch.device("cpu"))
    assert ran == []


@pytest.mark.gpu
def test_warm_up_runs_both_cudnn_variants(monkeypatch: pytest.MonkeyPatch):
    """The engine's start-up warm-up reaches the fresh and the split (cuDNN with log-sum-exp)
    paths on the 27B's heads, so their first-call cost is not a request's."""
    ran = _record_variants(monkeypatch)
    device = torch.device("cuda")
    gated_attention.warm_prefill_attention(24, 4, 256, dtype=torch.bfloat16, device=device)
    assert ran == ["fresh", "split"]
    assert split_attention._cudnn_mode in ("grouped", "expanded", "off")
