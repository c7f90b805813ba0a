"""Torch twin of the gated-delta prefill kernel: q/k L2 norm, g, beta, then the chunked rule.

Imports only torch. The front ops restate the model's prefill branch op for op (so the model's
CPU results do not move), and the delta rule runs in chunked (WY / UT-transform) form, one
sequence at a time; kernels/ may not import model/, so the model's `recurrent_gated_delta_rule`
stays the independent definition that tests hold this twin (and the kernel) to.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

L2_EPS = 1e-6  # the model's l2_norm default; not the RMSNorm eps


def _l2_norm(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + L2_EPS)


def _expand_key_heads(x: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """[..., Hk, Dk] -> [..., Hv, Dk]: each key head serves Hv / Hk consecutive value heads."""
    return x.repeat_interleave(num_v_heads // x.shape[-2], dim=-2)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    *,
    scale: float,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule in chunks: matmuls inside a chunk, a scan of states across chunks.

    Within a chunk with state S0 at its start and cumulative log decay G_t = sum_{s<=t} g_s, the
    per-token corrections U (rows u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t)) solve the unit lower
    triangular system (I + A) U = diag(beta) V - diag(beta e^G) K S0, with
    A[t, s] = beta_t e^{G_t - G_s} k_t.k_s for s < t. Then
        O    = diag(e^G) Q S0 + (e^{G_t - G_s} [s <= t] * Q K^T) U
        S_C  = e^{G_C} S0 + (diag(e^{G_C - G}) K)^T U.

    Args:
        q, k: [T, Hk, Dk] (L2-normalised); v: [T, Hv, Dv]; g (log decay, <= 0), beta: [T, Hv];
        initial_state: [Hv, Dk, Dv].
    Returns:
        (o [T, Hv, Dv] fp32, final state [Hv, Dk, Dv] fp32).
    """
    num_tokens, num_v_heads = v.shape[0], v.shape[1]
    q = _expand_key_heads(q.float(), num_v_heads) * scale
    k = _expand_key_heads(k.float(), num_v_heads)
    pad = (-num_tokens) % chunk_size  # padded steps: g = 0, beta = 0 leave the state unchanged
    num_chunks = (num_tokens + pad) // chunk_size

    def chunked(x: torch.Tensor) -> torch.Tensor:
        # [T, Hv, ...] -> [Hv, n, C, ...]
        x = F.pad(x.float().movedim(0, -1), (0, pad)).movedim(-1, 1)
        return x.reshape(x.shape[0], num_chunks, chunk_size, *x.shape[2:])

    q, k, v, g, beta = (chunked(x) for x in (q, k, v, g, beta))
    cum = g.cumsum(-1)  # [Hv, n, C]
    lower = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    # decay[..., t, s] = e^{G_t - G_s} for s <= t, else 0 (masked before exp: no overflow)
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()

    eye = torch.eye(chunk_size, dtype=q.dtype, device=q.device)
    a = (beta[..., :, None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    system = eye + a  # [Hv, n, C, C], unit lower triangular
    u0 = torch.linalg.solve_triangular(system, beta[..., None] * v, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(
        system, (beta * cum.exp())[..., None] * k, upper=False, unitriangular=True
    )
    attn = (q @ k.transpose(-1, -2)) * decay  # [Hv, n, C, C]
    q_read = q * cum.exp()[..., None]  # reads S0 decayed to each token
    k_write = k * (cum[..., -1:] - cum).exp()[..., None]  # writes decayed to the chunk end
    chunk_decay = cum[..., -1].exp()[..., None, None]  # [Hv, n, 1, 1]

    state = initial_state.float()
    out = torch.empty_like(v)
    for i in range(num_chunks):
        u = u0[:, i] - w[:, i] @ state  # [Hv, C, Dv]
        out[:, i] = q_read[:, i] @ state + attn[:, i] @ u
        state = state * chunk_decay[:, i] + k_write[:, i].transpose(-1, -2) @ u
    # [Hv, n, C, Dv] -> [T, Hv, Dv]
    out = out.reshape(num_v_heads, -1, v.shape[-1])[:, :num_tokens].transpose(0, 1)
    return out, state


def gated_delta_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    query_lens: tuple[int, ...],
    *,
    scale: float,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The prefill delta rule from the raw conv output and gate projections, per sequence.

    Normalises q and k per head (fp32), takes beta = sigmoid(b) and
    g = -exp(A_log) * softplus(a + dt_bias), then runs each sequence from its state slot and
    writes the final state back.

    Args:
        q, k: [T, Hk, Dk] conv output (not normalised); v: [T, Hv, Dv]; a, b: [T, Hv] raw gate
            projections (any of them may be strided views); a_log, dt_bias: [Hv];
        ssm_state: [S, Hv, Dk, Dv] fp32 (updated in place); state_slots: [B] int64, distinct;
        query_lens: B host ints summing to T;
        cu_seqlens: [B+1] device copy of their offsets; only the kernel reads it.
    Returns:
        [T, Hv, Dv] fp32.
    """
    del cu_seqlens
    q = _l2_norm(q)  # [T, Hk, Dk] fp32
    k = _l2_norm(k)
    beta = torch.sigmoid(b.float())  # [T, Hv]
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    parts = []
    start = 0
    for i, num_new in enumerate(query_lens):
        span = slice(start, start + num_new)
        slot = state_slots[i : i + 1]
        o, final = chunk_gated_delta_rule(
            q[span],
            k[span],
            v[span],
            g[span],
            beta[span],
            ssm_state.index_select(0, slot)[0],
            scale=scale,
        )
        ssm_state.index_copy_(0, slot, final[None])
        parts.append(o)
        start += num_new
    if not parts:
        return torch.empty(v.shape, dtype=torch.float32, device=v.device)
    return torch.cat(parts)  # [T, Hv, Dv] fp32
