"""Norms against transformers' Qwen3.5 modules (zero-centred RMSNorm, gated RMSNorm)."""

from __future__ import annotations

import pytest
import torch

from ninfer.model.layers.norm import gated_rms_norm, l2_norm, rms_norm

hf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


def test_rms_norm_is_zero_centred_like_transformers():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, 32, generator=gen) * 3
    module = hf.Qwen3_5RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(torch.randn(32, generator=gen) * 0.2)
        expected = module(x)
    torch.testing.assert_close(rms_norm(x, module.weight.detach(), 1e-6), expected)
    # Zero weight is the identity scale: unit RMS output.
    out = rms_norm(x, torch.zeros(32), 1e-6)
    torch.testing.assert_close(out.pow(2).mean(-1), torch.ones(5, 7), rtol=1e-4, atol=1e-4)


def test_rms_norm_keeps_bf16_and_computes_in_fp32():
    x = torch.randn(4, 64).to(torch.bfloat16)
    w = (torch.randn(64) * 0.1).to(torch.bfloat16)
    out = rms_norm(x, w, 1e-6)
    assert out.dtype == torch.bfloat16
    expected = rms_norm(x.float(), w.float(), 1e-6)
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)


def test_gated_rms_norm_matches_transformers():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(6, 16, generator=gen)
    gate = torch.randn(6, 16, generator=gen)
    module = hf.Qwen3_5RMSNormGated(16, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(1 + torch.randn(16, generator=gen) * 0.2)
        expected = module(x, gate)
    torch.testing.assert_close(gated_rms_norm(x, gate, module.weight.detach(), 1e-6), expected)


def test_l2_norm_matches_transformers():
    x = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(l2_norm(x), hf.l2norm(x, dim=-1, eps=1e-6))
    torch.testing.assert_close(l2_norm(x).norm(dim=-1), torch.ones(3, 4), rtol=1e-5, atol=1e-5)
