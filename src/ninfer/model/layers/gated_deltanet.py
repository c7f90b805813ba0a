"""Gated DeltaNet (linear attention) of Qwen3.5 with per-slot conv and recurrent state.

Imports torch, model.batch and kernels (dispatch and twins); no model layers. Prefill and decode
both go through `dispatch` (CUDA kernels on a GPU, their torch twins elsewhere): prefill as the
varlen conv then the fused norms + gates + delta rule (chunked WY form in the twin, token-serial
in the kernel), decode as one recurrent step per sequence, each reading and writing its state
slot in place. The state is fp32 [Hv, Dk, Dv] (key x value); key heads are repeated to value
heads (consecutive value heads share a key head). `recurrent_gated_delta_rule` here is the
independent definition both prefill forms are tested against; the prefill twins
(`causal_conv1d`, `chunk_gated_delta_rule`) live in kernels/ and are re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch
from ninfer.kernels.causal_conv1d.reference import causal_conv1d as causal_conv1d
from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from ninfer.kernels.gated_delta_prefill.reference import (
    chunk_gated_delta_rule as chunk_gated_delta_rule,
)
from ninfer.kernels.gated_delta_verify.reference import FoldLayer
from ninfer.model.batch import ForwardBatch


@dataclass(frozen=True)
class DeltaNetWeights:
    in_proj_qkv: torch.Tensor | Fp8Weight  # [conv_dim, H], conv_dim = 2 * Hk * Dk + Hv * Dv
    in_proj_z: torch.Tensor | Fp8Weight  # [Hv * Dv, H]
    in_proj_b: torch.Tensor | Fp8Weight  # [Hv, H]
    in_proj_a: torch.Tensor | Fp8Weight  # [Hv, H]
    conv1d: torch.Tensor  # [conv_dim, K] depthwise taps, oldest first
    dt_bias: torch.Tensor  # [Hv] fp32
    A_log: torch.Tensor  # [Hv] fp32 (the checkpoint's name)
    norm: torch.Tensor  # [Dv]
    out_proj: torch.Tensor | Fp8Weight  # [H, Hv * Dv]
    # Optional [conv_dim + Hv * Dv + 2 Hv, H]: qkv, z, b, a rows in one matrix (one GEMM per step;
    # the four fields above are then views into it; Qwen3_5Model binds it on CUDA).
    in_proj_fused: torch.Tensor | Fp8Weight | None = None
    # Optional, where the four cannot merge (fp8 qkv/z beside bf16 b/a): [conv_dim + Hv * Dv, H]
    # and [2 Hv, H], two GEMMs per step instead of four.
    in_proj_qkvz: torch.Tensor | Fp8Weight | None = None
    in_proj_ba: torch.Tensor | None = None


# --- causal depthwise conv1d -----------------------------------------------------------------


def causal_conv1d_update(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, state_slots: torch.Tensor
) -> torch.Tensor:
    """One decode step of `causal_conv1d` for a batch (one token per sequence).

    Args:
        x: [B, C]; weight: [C, K]; conv_state: [S, C, K-1] (updated in place); state_slots: [B].
    Returns:
        [B, C] in x's dtype.
    """
    window = torch.cat((conv_state[state_slots], x[:, :, None].to(conv_state.dtype)), dim=2)
    y = (window.float() * weight.float()[None]).sum(-1)  # [B, C]
    conv_state.index_copy_(0, state_slots, window[:, :, 1:])
    return F.silu(y).to(x.dtype)


# --- gated delta rule ------------------------------------------------------------------------


def _expand_key_heads(x: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """[..., Hk, Dk] -> [..., Hv, Dk]: each key head serves Hv / Hk consecutive value heads."""
    return x.repeat_interleave(num_v_heads // x.shape[-2], dim=-2)


def _delta_step(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """S <- e^g S + k (beta (v - e^g S^T k))^T; o = S^T q. Shapes [..., Hv, Dk(, Dv)]."""
    state = state * g.exp()[..., None, None]
    predicted = torch.einsum("...kv,...k->...v", state, k)
    delta = beta[..., None] * (v - predicted)
    state = state + k[..., :, None] * delta[..., None, :]
    return torch.einsum("...kv,...k->...v", state, q), state


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor,
    *,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule token by token: the definition the chunked form must reproduce.

    Args:
        q, k: [T, Hk, Dk] (L2-normalised); v: [T, Hv, Dv]; g (log decay, <= 0), beta: [T, Hv];
        initial_state: [Hv, Dk, Dv].
    Returns:
        (o [T, Hv, Dv] fp32, final state [Hv, Dk, Dv] fp32).
    """
    num_v_heads = v.shape[1]
    q = _expand_key_heads(q.float(), num_v_heads) * scale
    k = _expand_key_heads(k.float(), num_v_heads)
    v, g, beta = v.float(), g.float(), beta.float()
    state = initial_state.float()
    outputs = []
    for t in range(q.shape[0]):
        o_t, state = _delta_step(state, q[t], k[t], v[t], g[t], beta[t])
        outputs.append(o_t)
    out = torch.stack(outputs) if outputs else v.new_zeros(v.shape)
    return out, state


def gated_delta_rule_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    scale: float,
) -> torch.Tensor:
    """One recurrent step for a batch of sequences, updating their state slots in place.

    Args:
        q, k: [B, Hk, Dk] (L2-normalised); v: [B, Hv, Dv]; g, beta: [B, Hv];
        ssm_state: [S, Hv, Dk, Dv] fp32; state_slots: [B] int64.
    Returns:
        [B, Hv, Dv] fp32.
    """
    num_v_heads = v.shape[1]
    q = _expand_key_heads(q.float(), num_v_heads) * scale
    k = _expand_key_heads(k.float(), num_v_heads)
    out, state = _delta_step(ssm_state[state_slots], q, k, v.float(), g.float(), beta.float())
    ssm_state.index_copy_(0, state_slots, state)
    return out


# --- speculative verify ----------------------------------------------------------------------


class VerifyRecord(NamedTuple):
    """What a verify step's linear layer leaves for the fold, per sequence row and column:
    the conv inputs and the delta rule's inputs (a few KB per token, not a state per column)."""

    qkv: torch.Tensor  # [B, W, C] conv inputs, in the conv state's dtype
    k: torch.Tensor  # [B, W, Hk, Dk] fp32, L2-normalised
    v: torch.Tensor  # [B, W, Hv, Dv]
    g: torch.Tensor  # [B, W, Hv] fp32
    beta: torch.Tensor  # [B, W, Hv] fp32


def _verify_columns(
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    w: DeltaNetWeights,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
    batch: ForwardBatch,
    *,
    key_dim: int,
    scale: float,
) -> torch.Tensor:
    """A verify step's recurrence: W decode steps per sequence with the decode step's
    arithmetic, the slots' state read and left as it was.

    Why: the engine keeps only an accepted prefix of a verify row, known after the step. The
    slots stay at the pre-round state and `batch.verify_states` gets each column's inputs
    (`VerifyRecord`); `fold_verify_layers` later replays the kept columns with the same
    arithmetic, so the result is bit for bit the state that decoding those tokens one by one
    leaves. On CUDA one front and one recurrence kernel per layer (kernels/gated_delta_verify).
    """
    width = batch.verify_width
    num_seqs = batch.num_seqs
    head_k_dim = ssm_state.shape[2]
    q, k, v, g, beta = dispatch.gdn_verify_front(
        qkv,
        a,
        b,
        w.conv1d,
        w.A_log,
        w.dt_bias,
        conv_state,
        batch.state_slots,
        width=width,
        num_k_heads=key_dim // head_k_dim,
        head_k_dim=head_k_dim,
    )
    out = dispatch.gated_delta_verify(
        q, k, v, g, beta, ssm_state, batch.state_slots, width=width, scale=scale
    )
    if batch.verify_states is not None:
        batch.verify_states.append(
            VerifyRecord(
                qkv.to(conv_state.dtype).reshape(num_seqs, width, -1),
                k.reshape(num_seqs, width, *k.shape[1:]),
                v.reshape(num_seqs, width, *v.shape[1:]),
                g.reshape(num_seqs, width, -1),
                beta.reshape(num_seqs, width, -1),
            )
        )
    return out  # [B * W, Hv, Dv] in token order


def fold_verify_layers(
    records: Sequence[VerifyRecord],
    conv_states: Sequence[torch.Tensor],
    ssm_states: Sequence[torch.Tensor],
    state_slots: torch.Tensor,
    rows: torch.Tensor,
    num_columns: torch.Tensor,
    max_columns: int,
) -> None:
    """Advance each slot state_slots[i] of every linear layer over the first num_columns[i]
    (at least 1) columns of its verify row rows[i]: the conv state takes the last K-1 conv
    inputs, the delta-rule state replays the recorded steps with the decode step's arithmetic
    (bitwise what the verify computed). One kernel per state kind for all layers on CUDA.

    Args:
        records, conv_states, ssm_states: one per linear layer, in layer order;
        state_slots, rows, num_columns: [N] int64; max_columns: a host bound on num_columns.
    """
    layers = [
        FoldLayer(conv, ssm, r.qkv, r.k, r.v, r.g, r.beta)
        for r, conv, ssm in zip(records, conv_states, ssm_states, strict=True)
    ]
    dispatch.fold_verify_layers(layers, state_slots, rows, num_columns, max_columns)


# --- the layer -------------------------------------------------------------------------------


def gated_deltanet(
    x: torch.Tensor,
    w: DeltaNetWeights,
    *,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
    batch: ForwardBatch,
    eps: float,
) -> torch.Tensor:
    """The linear-attention token mixer; head counts and dims are read from the tensors.

    Args:
        x: [T, H] (already input-normed); conv_state: [S, C, K-1]; ssm_state: [S, Hv, Dk, Dv].
    Returns:
        [T, H].
    """
    num_tokens = x.shape[0]
    _, num_v_heads, head_k_dim, head_v_dim = ssm_state.shape
    value_dim = num_v_heads * head_v_dim
    conv_dim = w.in_proj_qkv.shape[0]
    key_dim = (conv_dim - value_dim) // 2

    if w.in_proj_fused is not None:
        proj = dispatch.linear(x, w.in_proj_fused)  # [T, conv_dim + Hv*Dv + 2 Hv]
        qkv, z, b, a = proj.split((conv_dim, value_dim, num_v_heads, num_v_heads), dim=-1)
    elif w.in_proj_qkvz is not None and w.in_proj_ba is not None:
        # fp8 qkv/z beside the bf16 b/a (kept in high precision): one x, two launches, the
        # small one on a side stream at decode sizes
        qkvz, ba = dispatch.linear_pair(x, w.in_proj_qkvz, w.in_proj_ba)
        qkv, z = qkvz.split((conv_dim, value_dim), dim=-1)
        b, a = ba.split((num_v_heads, num_v_heads), dim=-1)
    else:
        qkv = dispatch.linear(x, w.in_proj_qkv)  # [T, conv_dim]
        z = dispatch.linear(x, w.in_proj_z)
        b = dispatch.linear(x, w.in_proj_b)
        a = dispatch.linear(x, w.in_proj_a)
    z = z.reshape(num_tokens, num_v_heads, head_v_dim)
    scale = head_k_dim**-0.5
    # opt-in: out_proj's weights into L2 beside the front and the delta rule (joined below)
    ahead = dispatch.prefetch_ahead(x, w.out_proj)

    if batch.is_verify:
        out = _verify_columns(
            qkv, a, b, w, conv_state, ssm_state, batch, key_dim=key_dim, scale=scale
        )
    elif batch.is_decode:
        # One fused kernel on CUDA (conv update, SiLU, L2 norms, g, beta), the torch ops elsewhere.
        q, k, v, g, beta = dispatch.gdn_decode_front(
            qkv,
            a,
            b,
            w.conv1d,
            w.A_log,
            w.dt_bias,
            conv_state,
            batch.state_slots,
            num_k_heads=key_dim // head_k_dim,
            head_k_dim=head_k_dim,
        )
        out = dispatch.gated_delta_rule_decode(
            q, k, v, g, beta, ssm_state, batch.state_slots, scale=scale
        )
    else:
        # Two kernels on CUDA (conv + SiLU; norms, gates and the delta rule), the twins elsewhere.
        mixed = dispatch.causal_conv1d(
            qkv,
            w.conv1d,
            conv_state,
            batch.state_slots,
            batch.query_lens,
            cu_seqlens=batch.cu_seqlens,
        )
        q, k, v = mixed.split((key_dim, key_dim, value_dim), dim=-1)
        out = dispatch.gated_delta_prefill(
            q.reshape(num_tokens, -1, head_k_dim),  # [T, Hk, Dk] views, rows strided
            k.reshape(num_tokens, -1, head_k_dim),
            v.reshape(num_tokens, num_v_heads, head_v_dim),
            a,
            b,
            w.A_log,
            w.dt_bias,
            ssm_state,
            batch.state_slots,
            batch.query_lens,
            scale=scale,
            cu_seqlens=batch.cu_seqlens,
        )  # [T, Hv, Dv] fp32

    out = dispatch.gated_rms_norm(out, z, w.norm, eps, x.dtype)
    dispatch.join(ahead)
    return dispatch.linear(out.reshape(num_tokens, -1), w.out_proj)
