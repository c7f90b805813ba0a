"""Torch twin of the Gated DeltaNet decode-front kernel.

Imports only torch. Restates, op for op, what the model's decode branch does between the input
projections and the recurrent step (`causal_conv1d_update`, the q/k/v split, `l2_norm`, beta and
g in model/layers/gated_deltanet.py), because kernels/ may not import model/; a CPU test holds
the two bit-identical, so wiring this into the model changes nothing on the CPU.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

L2_EPS = 1e-6  # the model's l2_norm default; not the RMSNorm eps


class DecodeFront(NamedTuple):
    q: torch.Tensor  # [B, Hk, Dk] fp32, L2-normalised
    k: torch.Tensor  # [B, Hk, Dk] fp32, L2-normalised
    v: torch.Tensor  # [B, Hv, Dv] in qkv's dtype
    g: torch.Tensor  # [B, Hv] fp32 log decay
    beta: torch.Tensor  # [B, Hv] fp32


def _l2_norm(x: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + L2_EPS)


def gdn_decode_front(
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    num_k_heads: int,
    head_k_dim: int,
) -> DecodeFront:
    """Conv-state update + SiLU, split into q/k/v, q/k L2 norm, beta and g for one decode step.

    Args:
        qkv: [B, C] in_proj_qkv output (C = 2 Hk Dk + Hv Dv); a, b: [B, Hv] in_proj_a/_b outputs;
        conv_weight: [C, K]; a_log, dt_bias: [Hv]; conv_state: [S, C, K-1] (updated in place);
        state_slots: [B] int64.
    """
    num_seqs = qkv.shape[0]
    window = torch.cat((conv_state[state_slots], qkv[:, :, None].to(conv_state.dtype)), dim=2)
    y = (window.float() * conv_weight.float()[None]).sum(-1)  # [B, C]
    conv_state.index_copy_(0, state_slots, window[:, :, 1:])
    mixed = F.silu(y).to(qkv.dtype)
    key_dim = num_k_heads * head_k_dim
    q, k, v = mixed.split((key_dim, key_dim, mixed.shape[1] - 2 * key_dim), dim=-1)
    q = _l2_norm(q.reshape(num_seqs, -1, head_k_dim))  # [B, Hk, Dk]
    k = _l2_norm(k.reshape(num_seqs, -1, head_k_dim))
    num_v_heads = a.shape[-1]
    v = v.reshape(num_seqs, num_v_heads, -1)  # [B, Hv, Dv]
    beta = torch.sigmoid(b.float())
    g = -a_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return DecodeFront(q, k, v, g, beta)
