"""Causal attention of a continued prefill chunk as two fused calls merged by log-sum-exp.

Why: a later chunk's n queries see all L - n earlier keys and, causally, their own n. For that
lower-right pattern on grouped heads SDPA's only fused backend is flash (FA2), which runs the
27B's head dim of 256 at ~310 TFLOP/s on an H200 (8k queries over 32k keys: 18.6 ms per layer,
docs/perf.md run U3), while cuDNN runs plain causal and unmasked attention at ~660 (8k causal:
1.25 ms). Split, the prefix part is unmasked and the own part is plain causal; both go to cuDNN,
which also returns each part's log-sum-exp, and the partial outputs are weighed exactly as one
softmax over the union of keys weighs them.

Imports torch and cudnn_plans. The CUDA path uses `aten._scaled_dot_product_cudnn_attention`
(the op behind SDPA's cuDNN backend, the only one that hands back the log-sum-exp); where it
refuses the operands, `split_prefix_attention` returns None and the caller keeps its single
lower-right SDPA call.
"""

from __future__ import annotations

import torch

from ninfer.model.layers.cudnn_plans import bshd_heads

# "grouped": the op takes Hk < Hq directly; "expanded": only with repeated KV heads; "off": the
# op does not exist in this torch; None: nothing has run yet
_cudnn_mode: str | None = None


def attention_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, is_causal: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Attention of one sequence and the natural-log log-sum-exp of each query's scaled scores.

    `is_causal` is the top-left pattern (query i sees keys 0..i), used only with n == L here.
    CUDA: cuDNN, or None where the op cannot run. Elsewhere: the fp32 math twin.

    Args:
        q: [n, Hq, D]; k, v: [L, Hk, D] with Hq a multiple of Hk.
    Returns:
        ([n, Hq, D] in q's dtype, [Hq, n] fp32), or None.
    """
    if q.is_cuda:
        return _cudnn_attention_lse(q, k, v, scale=scale, is_causal=is_causal)
    return attention_lse_reference(q, k, v, scale=scale, is_causal=is_causal)


def attention_lse_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, is_causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 scores, softmax and log-sum-exp: the twin the cuDNN path is tested against."""
    rep = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(rep, dim=1)
    vf = v.float().repeat_interleave(rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), kf) * scale
    if is_causal:
        n, length = q.shape[0], k.shape[0]
        above = torch.ones(n, length, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [Hq, n]
    out = torch.einsum("hqk,khd->qhd", (scores - lse[..., None]).exp(), vf)
    return out.to(q.dtype), lse


def merge_partials(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """One softmax over keys A ∪ B from the two partial results (disjoint key sets).

    The union's weights are exp(lse_a) and exp(lse_b) normalized, so the merged output is
    out_b + (out_a - out_b) * sigmoid(lse_a - lse_b), computed in fp32.

    Args:
        out_a, out_b: [n, H, D]; lse_a, lse_b: [H, n] fp32.
    Returns:
        [n, H, D] in out_a's dtype.
    """
    weight_a = torch.sigmoid(lse_a - lse_b).transpose(0, 1)[..., None]  # [n, H, 1]
    return torch.lerp(out_b.float(), out_a.float(), weight_a).to(out_a.dtype)


def split_prefix_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float
) -> torch.Tensor | None:
    """Lower-right causal attention of n queries over L keys (the last n keys are their own) as
    an unmasked part over the first L - n keys and a causal part over the last n, merged.

    Args:
        q: [n, Hq, D]; k, v: [L, Hk, D] with L > n.
    Returns:
        [n, Hq, D] in q's dtype, or None where `attention_lse` cannot run.
    """
    n, length = q.shape[0], k.shape[0]
    if length <= n:
        raise ValueError(f"split_prefix_attention needs a prefix: {n} queries over {length} keys")
    prefix = length - n
    earlier = attention_lse(q, k[:prefix], v[:prefix], scale=scale, is_causal=False)
    if earlier is None:
        return None
    own = attention_lse(q, k[prefix:], v[prefix:], scale=scale, is_causal=True)
    if own is None:
        return None
    return merge_partials(earlier[0], earlier[1], own[0], own[1])


def _cudnn_attention_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, is_causal: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """cuDNN's attention with its log-sum-exp: grouped heads, else expanded ones (the first form
    that runs is kept); None where neither runs these operands, and from then on where the op
    does not exist in this torch."""
    global _cudnn_mode
    if _cudnn_mode == "off":
        return None
    for mode in [_cudnn_mode] if _cudnn_mode else ["grouped", "expanded"]:
        try:
            result = _cudnn_call(
                q, k, v, scale=scale, is_causal=is_causal, expand=mode == "expanded"
            )
        except AttributeError:  # no such op in this torch
            _cudnn_mode = "off"
            return None
        except (RuntimeError, NotImplementedError):
            continue
        _cudnn_mode = mode
        return result
    return None


def _cudnn_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float,
    is_causal: bool,
    expand: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    rep = q.shape[1] // k.shape[1]
    if expand and rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    # [T, H, D] -> [1, H, T, D] views of BSHD memory (the layout SDPA's public path hands the
    # same op, and the one whose cuDNN plans do not depend on the lengths: cudnn_plans.py)
    qh, kh, vh = bshd_heads(q), bshd_heads(k.to(q.dtype)), bshd_heads(v.to(q.dtype))
    result = torch.ops.aten._scaled_dot_product_cudnn_attention(
        qh, kh, vh, None, True, 0.0, is_causal, False, scale=scale
    )
    out, lse = result[0], result[1]
    n = q.shape[0]
    return out[0].transpose(0, 1), lse.reshape(q.shape[1], n).float()
