"""Torch twin of the prefill causal-conv1d kernel: the model's prefill conv, moved here.

Imports only torch. Each sequence of a varlen batch continues its conv state slot and leaves its
last K-1 inputs there; sequences run one at a time through F.conv1d in fp32, so the twin is the
plain definition (the kernel is checked against it on the GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    query_lens: tuple[int, ...],
    *,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Depthwise causal conv + SiLU over the new tokens of each sequence, continuing its state.

    Args:
        x: [T, C] new inputs, sequences back to back (lengths `query_lens`); rows may be strided.
        weight: [C, K]; conv_state: [S, C, K-1] (updated in place: the last K-1 inputs).
        state_slots: [B] int64.
        cu_seqlens: [B+1] device copy of the offsets of `query_lens`; only the kernel reads it
            (the twin sizes its loop from the host tuple, without a device sync).
    Returns:
        [T, C] in x's dtype.
    """
    del cu_seqlens
    num_channels, kernel = weight.shape
    w = weight.float()[:, None, :]  # [C, 1, K]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    start = 0
    for b, num_new in enumerate(query_lens):
        slot = state_slots[b : b + 1]
        history = conv_state.index_select(0, slot)[0].float()  # [C, K-1]
        seq = torch.cat((history, x[start : start + num_new].float().T), dim=1)  # [C, K-1+n]
        y = F.conv1d(seq[None], w, groups=num_channels)[0]  # [C, n]
        out[start : start + num_new] = F.silu(y).T.to(x.dtype)
        new_history = seq[:, seq.shape[1] - (kernel - 1) :]
        conv_state.index_copy_(0, slot, new_history[None].to(conv_state.dtype))
        start += num_new
    return out
