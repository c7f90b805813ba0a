"""A continued chunk's attention split into an unmasked prefix part and a causal own part, merged
by log-sum-exp, against one softmax over all keys (fp64 reference).

CPU: the math twin of `attention_lse` exercises the split and the merge (fp32, rel. error
< 1e-5). GPU: the cuDNN op itself, bf16 on the 27B's heads (24 over 4 of 256) and a small
shape; its log-sum-exp within 2e-3 absolute of the fp32 twin's, outputs within 2 % of the
largest reference value (bf16 inputs and outputs) and as close to the reference as SDPA's own
lower-right flash call.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from ninfer.model.layers.split_attention import (
    attention_lse,
    attention_lse_reference,
    merge_partials,
    split_prefix_attention,
)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()


def lower_right_reference(q, k, v, scale: float) -> torch.Tensor:
    """q [n, Hq, D] as the last n of L positions; fp64 softmax over keys 0..L-n+i."""
    n, length = q.shape[0], k.shape[0]
    rep = q.shape[1] // k.shape[1]
    kd = k.double().repeat_interleave(rep, dim=1)
    vd = v.double().repeat_interleave(rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), kd) * scale
    q_pos = torch.arange(n, device=q.device)[:, None] + (length - n)
    hidden = torch.arange(length, device=q.device)[None, :] > q_pos
    scores = scores.masked_fill(hidden, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vd)


def operands(n, length, hq, hk, d, *, device="cpu", dtype=torch.float32, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(n, hq, d, generator=gen, device=device, dtype=dtype)
    k = torch.randn(length, hk, d, generator=gen, device=device, dtype=dtype)
    v = torch.randn(length, hk, d, generator=gen, device=device, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize(("n", "length"), [(1, 2), (5, 6), (7, 40), (33, 34), (16, 17 * 16)])
@pytest.mark.parametrize(("hq", "hk"), [(4, 4), (6, 2)])
def test_split_matches_one_softmax(n: int, length: int, hq: int, hk: int):
    q, k, v = operands(n, length, hq, hk, 8, seed=n * 100 + length + hq)
    got = split_prefix_attention(q, k, v, scale=8**-0.5)
    assert got is not None and got.shape == q.shape
    assert rel_err(got, lower_right_reference(q, k, v, 8**-0.5)) < 1e-5


def test_merge_weights_each_part_by_its_mass():
    """Keys split anywhere merge to the whole: a wrong weight (e.g. log base) would show here."""
    q, k, v = operands(9, 9, 3, 1, 4, seed=3)
    whole, whole_lse = attention_lse_reference(q, k, v, scale=1.3, is_causal=False)
    for cut in (1, 4, 8):
        a = attention_lse_reference(q, k[:cut], v[:cut], scale=1.3, is_causal=False)
        b = attention_lse_reference(q, k[cut:], v[cut:], scale=1.3, is_causal=False)
        assert rel_err(merge_partials(a[0], a[1], b[0], b[1]), whole) < 1e-5
        assert rel_err(torch.logaddexp(a[1], b[1]), whole_lse) < 1e-6


def test_needs_a_prefix():
    q, k, v = operands(4, 4, 2, 2, 8)
    with pytest.raises(ValueError, match="needs a prefix"):
        split_prefix_attention(q, k, v, scale=1.0)


def test_cpu_twin_lse_is_the_logsumexp_of_scaled_scores():
    q, k, v = operands(6, 6, 2, 1, 8, seed=11)
    _, lse = attention_lse(q, k, v, scale=0.5, is_causal=True)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double().expand(6, 2, 8)) * 0.5
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(lse.double(), torch.logsumexp(scores, -1), atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("n", "length", "hq", "hk", "d"),
    [
        (600, 1500, 24, 4, 256),
        (512, 513, 24, 4, 256),
        (1024, 4096, 8, 2, 128),
        (700, 900, 4, 4, 64),
    ],
)
def test_cudnn_split_matches_reference(n: int, length: int, hq: int, hk: int, d: int):
    q, k, v = operands(n, length, hq, hk, d, device="cuda", dtype=torch.bfloat16, seed=n + length)
    scale = d**-0.5
    for causal, kk, vv in ((False, k[: length - n], v[: length - n]), (True, k[-n:], v[-n:])):
        got = attention_lse(q, kk, vv, scale=scale, is_causal=causal)
        if got is None:
            pytest.skip("cuDNN attention with log-sum-exp is not available on this install")
        want = attention_lse_reference(q, kk, vv, scale=scale, is_causal=causal)
        assert torch.allclose(got[1], want[1], atol=2e-3, rtol=0), causal
    got = split_prefix_attention(q, k, v, scale=scale)
    assert got is not None and got.dtype == torch.bfloat16
    want = lower_right_reference(q, k, v, scale)
    err = rel_err(got, want)
    qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))
    flash = F.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=causal_lower_right(n, length), scale=scale, enable_gqa=True
    )[0].transpose(0, 1)
    assert err < 2e-2
    assert err < 2 * rel_err(flash, want) + 1e-3
