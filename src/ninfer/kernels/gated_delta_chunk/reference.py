"""Torch twin of the chunked gated-delta prefill kernel: the same two phases and roundings.

Imports only torch. Phase 1 (`chunk_terms`, parallel over 64-token chunks) turns the raw q/k and
gate projections into what the serial phase needs: the intra-chunk attention matrix, the inverse
of the UT system with beta folded in, and per-token row scales that carry the L2 norms and decays.
Phase 2 (`chunk_recurrence`) walks each sequence's chunks from its fp32 state slot. With
`operand_dtype=torch.bfloat16` every matrix-product operand is rounded where the kernel's tensor
cores take it (products accumulate in fp32), so kernel and twin differ by summation order only;
`operand_dtype=None` is the exact chunked form in fp32.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

CHUNK = 64  # GDC_CHUNK in gated_delta_chunk.cu
L2_EPS = 1e-6  # the model's l2_norm default


class ChunkTerms(NamedTuple):
    """Phase 1's output, one row per token (row t of its chunk), as the kernel stores it.

    attn:   [T, Hv, C] scale * e^{G_t - G_s} * qn_t . kn_s for s <= t, else 0.
    tbeta:  [T, Hv, C] (I + A)^{-1} diag(beta), A[t, s] = beta_t e^{G_t - G_s} kn_t . kn_s (s < t).
    scales: [T, Hv, 4] (scale e^{G_t} / |q_t|, e^{G_t} / |k_t|, e^{G_last - G_t} / |k_t|, and
            e^{G_last} on a chunk's first token, else 0); G is the cumulative log decay from the
            chunk's start, G_last its value at the chunk's last token; norms include the eps.
    """

    attn: torch.Tensor
    tbeta: torch.Tensor
    scales: torch.Tensor


def _round(x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """x in fp32, rounded through `dtype` first where the kernel rounds (None: not rounded)."""
    return x.float() if dtype is None else x.to(dtype).float()


def _gates(
    a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g = -e^{A_log} softplus(a + dt_bias), beta = sigmoid(b)), both [T, Hv] fp32."""
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def _in_chunks(x: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """[n, ...] -> [num_chunks, C, ...], zero rows after the sequence's last token."""
    pad = num_chunks * CHUNK - x.shape[0]
    x = torch.cat((x, x.new_zeros((pad, *x.shape[1:])))) if pad else x
    return x.reshape(num_chunks, CHUNK, *x.shape[1:])


def _sequence_terms(
    q: torch.Tensor,
    k: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    num_v_heads: int,
    scale: float,
) -> ChunkTerms:
    """Phase 1 for one sequence: q, k [n, Hk, Dk] fp32 (rounded as the kernel reads them)."""
    num_tokens = q.shape[0]
    num_chunks = -(-num_tokens // CHUNK)
    group = num_v_heads // q.shape[1]
    inv_q = torch.rsqrt(q.pow(2).sum(-1) + L2_EPS)  # [n, Hk]
    inv_k = torch.rsqrt(k.pow(2).sum(-1) + L2_EPS)
    qc, kc = _in_chunks(q, num_chunks), _in_chunks(k, num_chunks)  # [N, C, Hk, Dk]
    # raw dot products of the chunk's tokens per key head, then per value head: [N, Hv, C, C]
    kk = torch.einsum("ntkd,nskd->nkts", kc, kc).repeat_interleave(group, dim=1)
    qk = torch.einsum("ntkd,nskd->nkts", qc, kc).repeat_interleave(group, dim=1)

    def per_head(x: torch.Tensor) -> torch.Tensor:  # [n, H] -> [N, Hv, C]
        x = x.repeat_interleave(num_v_heads // x.shape[1], dim=1)
        return _in_chunks(x, num_chunks).transpose(1, 2)

    iq, ik = per_head(inv_q), per_head(inv_k)
    gc, bc = per_head(g), per_head(beta)  # padded tokens: g = 0, beta = 0
    cum = gc.cumsum(-1)  # [N, Hv, C]
    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    kkn = kk * ik[..., :, None] * ik[..., None, :]
    a_mat = (bc[..., :, None] * decay * kkn).tril(-1)
    eye = torch.eye(CHUNK, dtype=torch.float32, device=q.device)
    inverse = torch.linalg.solve_triangular(
        eye + a_mat, eye.expand_as(a_mat), upper=False, unitriangular=True
    )
    tbeta = inverse * bc[..., None, :]
    attn = decay * qk * (iq[..., :, None] * ik[..., None, :] * scale)
    last = cum[..., -1:]  # padded g = 0, so this is G at the chunk's last real token
    first = torch.zeros_like(cum)
    first[..., 0] = last[..., 0].exp()
    scales = torch.stack(
        (scale * cum.exp() * iq, cum.exp() * ik, (last - cum).exp() * ik, first), dim=-1
    )  # [N, Hv, C, 4]

    def rows(x: torch.Tensor) -> torch.Tensor:  # [N, Hv, C, ...] -> [n, Hv, ...]
        x = x.transpose(1, 2)
        return x.reshape(num_chunks * CHUNK, *x.shape[2:])[:num_tokens]

    return ChunkTerms(rows(attn), rows(tbeta), rows(scales))


def chunk_terms(
    q: torch.Tensor,
    k: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    query_lens: tuple[int, ...],
    *,
    scale: float,
    operand_dtype: torch.dtype | None = torch.bfloat16,
) -> ChunkTerms:
    """Phase 1 for every sequence (chunks start at each sequence's first token).

    Args:
        q, k: [T, Hk, Dk] raw conv output (not normalised); a, b: [T, Hv] raw gate projections;
        a_log, dt_bias: [Hv]; query_lens: B host ints summing to T.
    Returns:
        ChunkTerms in fp32, attn and tbeta rounded through `operand_dtype` (the kernel stores them
        in bf16).
    """
    q, k = _round(q, operand_dtype), _round(k, operand_dtype)
    g, beta = _gates(a, b, a_log, dt_bias)
    parts = []
    start = 0
    for n in query_lens:
        span = slice(start, start + n)
        if n:
            parts.append(_sequence_terms(q[span], k[span], g[span], beta[span], a.shape[1], scale))
        start += n
    if not parts:
        empty = q.new_zeros((0, a.shape[1], CHUNK))
        return ChunkTerms(empty, empty, q.new_zeros((0, a.shape[1], 4)))
    attn, tbeta, scales = (torch.cat(x) for x in zip(*parts, strict=True))
    return ChunkTerms(_round(attn, operand_dtype), _round(tbeta, operand_dtype), scales)


def chunk_recurrence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    terms: ChunkTerms,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    query_lens: tuple[int, ...],
    *,
    operand_dtype: torch.dtype | None = torch.bfloat16,
) -> torch.Tensor:
    """Phase 2: per sequence and chunk, from the state S0 at the chunk's start,

        R  = V - diag(kr) K S0            (the new values each token would still write)
        U  = Tbeta R                      (the UT transform: the corrections of all C tokens)
        O  = diag(qs) Q S0 + attn U
        S  = gamma S0 + K^T diag(kw) U,

    with raw q/k rows (the norms and decays live in qs, kr, kw). The state stays fp32; S0, R, U
    and kw U enter their products rounded through `operand_dtype`, as in the kernel.

    Returns:
        [T, Hv, Dv] fp32; the final states are written back to their slots.
    """
    num_v_heads = v.shape[1]
    group = num_v_heads // q.shape[1]
    q = _round(q, operand_dtype).repeat_interleave(group, dim=1).transpose(0, 1)  # [Hv, T, Dk]
    k = _round(k, operand_dtype).repeat_interleave(group, dim=1).transpose(0, 1)
    v = _round(v, operand_dtype).transpose(0, 1)  # [Hv, T, Dv]
    attn, tbeta = terms.attn.transpose(0, 1), terms.tbeta.transpose(0, 1)  # [Hv, T, C]
    scales = terms.scales.transpose(0, 1)  # [Hv, T, 4]
    out = torch.empty_like(v)
    start = 0
    for i, n in enumerate(query_lens):
        slot = state_slots[i : i + 1]
        state = ssm_state.index_select(0, slot)[0].float()  # [Hv, Dk, Dv]
        for c0 in range(start, start + n, CHUNK):
            rows = slice(c0, min(c0 + CHUNK, start + n))
            m = rows.stop - rows.start
            qs, kr, kw = (scales[:, rows, j, None] for j in range(3))  # [Hv, m, 1]
            gamma = scales[:, c0, 3, None, None]  # [Hv, 1, 1]
            s0 = _round(state, operand_dtype)
            r = _round(v[:, rows] - kr * (k[:, rows] @ s0), operand_dtype)
            u = tbeta[:, rows, :m] @ r  # [Hv, m, Dv]
            ub = _round(u, operand_dtype)
            out[:, rows] = qs * (q[:, rows] @ s0) + attn[:, rows, :m] @ ub
            uw = _round(kw * u, operand_dtype)
            state = gamma * state + k[:, rows].transpose(1, 2) @ uw
        ssm_state.index_copy_(0, slot, state[None].to(ssm_state.dtype))
        start += n
    return out.transpose(0, 1)


def gated_delta_chunk_prefill(
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
    operand_dtype: torch.dtype | None = torch.bfloat16,
) -> torch.Tensor:
    """`gated_delta_prefill.reference.gated_delta_prefill` computed as the chunk kernel does.

    Args:
        as `gated_delta_prefill` (q, k [T, Hk, Dk] and v [T, Hv, Dv] raw conv output, a, b [T, Hv]
        raw gate projections, ssm_state [S, Hv, Dk, Dv] fp32 updated in place at `state_slots`);
        operand_dtype: bf16 to round as the kernel, None for the exact chunked form.
    Returns:
        [T, Hv, Dv] fp32.
    """
    del cu_seqlens
    terms = chunk_terms(
        q, k, a, b, a_log, dt_bias, query_lens, scale=scale, operand_dtype=operand_dtype
    )
    return chunk_recurrence(
        q, k, v, terms, ssm_state, state_slots, query_lens, operand_dtype=operand_dtype
    )
