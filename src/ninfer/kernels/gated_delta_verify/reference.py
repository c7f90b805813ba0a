"""Torch twins of the speculative verify and fold kernels of the Gated DeltaNet layers.

Imports torch and the decode twins. A verify step is W decode steps per sequence on working
copies of the slots' state (the slots stay as they were); a fold replays a prefix of those steps
into the slots. Written with the decode step's own twins, column by column, so on the CPU a
verify and a fold give bit for bit what decoding the same tokens one by one gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ninfer.kernels.gated_delta_decode import reference as delta_ref
from ninfer.kernels.gdn_decode_front import reference as front_ref
from ninfer.kernels.gdn_decode_front.reference import DecodeFront


class FoldLayer(NamedTuple):
    """One linear layer's state and its verify step's records (all [R, W, ...] per column)."""

    conv_state: torch.Tensor  # [S, C, K-1]
    ssm_state: torch.Tensor  # [S, Hv, Dk, Dv] fp32
    qkv: torch.Tensor  # [R, W, C] conv inputs, in conv_state's dtype
    k: torch.Tensor  # [R, W, Hk, Dk] fp32, L2-normalised
    v: torch.Tensor  # [R, W, Hv, Dv]
    g: torch.Tensor  # [R, W, Hv] fp32
    beta: torch.Tensor  # [R, W, Hv] fp32


def gdn_verify_front(
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    width: int,
    num_k_heads: int,
    head_k_dim: int,
) -> DecodeFront:
    """The decode front over W columns per sequence; conv_state is read, not written.

    Args:
        qkv: [B * W, C]; a, b: [B * W, Hv] (row b * W + j: column j of sequence b);
        state_slots: [B]. Returns q, k, v, g, beta with B * W rows, in that order.
    """
    num_seqs = state_slots.shape[0]
    conv = conv_state.index_select(0, state_slots)  # the working copy
    rows = torch.arange(num_seqs, device=qkv.device)
    qkv, a, b = (t.reshape(num_seqs, width, -1) for t in (qkv, a, b))
    cols = [
        front_ref.gdn_decode_front(
            qkv[:, j],
            a[:, j],
            b[:, j],
            conv_weight,
            a_log,
            dt_bias,
            conv,
            rows,
            num_k_heads=num_k_heads,
            head_k_dim=head_k_dim,
        )
        for j in range(width)
    ]
    return DecodeFront(*(torch.stack(parts, 1).flatten(0, 1) for parts in zip(*cols, strict=True)))


def gated_delta_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    width: int,
    scale: float,
) -> torch.Tensor:
    """W decode steps per sequence on a working copy of its state; ssm_state is not written.

    Args:
        q, k: [B * W, Hk, Dk]; v: [B * W, Hv, Dv]; g, beta: [B * W, Hv]; state_slots: [B].
    Returns:
        [B * W, Hv, Dv] fp32, row b * W + j the output of column j of sequence b.
    """
    num_seqs = state_slots.shape[0]
    work = ssm_state.index_select(0, state_slots)
    rows = torch.arange(num_seqs, device=q.device)
    q, k, v, g, beta = (t.reshape(num_seqs, width, *t.shape[1:]) for t in (q, k, v, g, beta))
    outs = [
        delta_ref.gated_delta_rule_decode(
            q[:, j], k[:, j], v[:, j], g[:, j], beta[:, j], work, rows, scale=scale
        )
        for j in range(width)
    ]
    return torch.stack(outs, 1).flatten(0, 1)


def fold_layers(
    layers: Sequence[FoldLayer],
    state_slots: torch.Tensor,
    rows: torch.Tensor,
    num_columns: torch.Tensor,
    max_columns: int,
) -> None:
    """Advance slot state_slots[i] of every layer over the first num_columns[i] (>= 1) columns
    of its verify row rows[i]: the conv state takes the last K-1 inputs, the delta-rule state
    replays the recorded steps with the decode step's op.

    Args:
        state_slots, rows, num_columns: [N] int64; max_columns: a host bound on num_columns.
    """
    for layer in layers:
        _fold_conv(layer, state_slots, rows, num_columns)
        _fold_delta(layer, state_slots, rows, num_columns, max_columns)


def _fold_conv(layer: FoldLayer, slots: torch.Tensor, rows: torch.Tensor, n: torch.Tensor) -> None:
    conv = layer.conv_state.index_select(0, slots)  # [N, C, K-1]
    window = torch.cat((conv, layer.qkv.index_select(0, rows).transpose(1, 2)), dim=2)
    tail = n[:, None] + torch.arange(conv.shape[2], device=conv.device)  # [N, K-1]
    layer.conv_state.index_copy_(0, slots, window.gather(2, tail[:, None, :].expand_as(conv)))


def _fold_delta(
    layer: FoldLayer, slots: torch.Tensor, rows: torch.Tensor, n: torch.Tensor, most: int
) -> None:
    work = layer.ssm_state.index_select(0, slots)
    local = torch.arange(slots.shape[0], device=work.device)
    for c in range(min(most, layer.k.shape[1])):
        before = work.clone() if c else None  # column 0 is always kept: no select needed
        k = layer.k[rows, c]
        delta_ref.gated_delta_rule_decode(
            k, k, layer.v[rows, c], layer.g[rows, c], layer.beta[rows, c], work, local, scale=1.0
        )
        if before is not None:
            work = torch.where((c < n)[:, None, None, None], work, before)
    layer.ssm_state.index_copy_(0, slots, work)
