"""Torch twin of the batched gated-delta decode kernel.

Imports only torch. Same signature and maths as the model's `gated_delta_rule_decode`
(model/layers/gated_deltanet.py), repeated here because kernels/ may not import model/; a CPU
test holds the two equal. State slots are read and written in place, one slot per row.
"""

from __future__ import annotations

import torch


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
    """One step `S <- e^g S + k (beta (v - e^g S^T k))^T; o = scale S^T q` per row and head.

    Args:
        q, k: [B, Hk, Dk] (L2-normalised); v: [B, Hv, Dv]; g (log decay), beta: [B, Hv];
        ssm_state: [S, Hv, Dk, Dv] fp32 (updated in place); state_slots: [B] int64, distinct.
    Returns:
        [B, Hv, Dv] fp32.
    """
    num_v_heads = v.shape[1]
    repeat = num_v_heads // q.shape[1]
    qf = q.float().repeat_interleave(repeat, dim=1) * scale  # [B, Hv, Dk]
    kf = k.float().repeat_interleave(repeat, dim=1)
    state = ssm_state[state_slots] * g.float().exp()[..., None, None]  # [B, Hv, Dk, Dv]
    predicted = torch.einsum("bhkv,bhk->bhv", state, kf)
    delta = beta.float()[..., None] * (v.float() - predicted)
    state = state + kf[..., :, None] * delta[..., None, :]
    ssm_state.index_copy_(0, state_slots, state)
    return torch.einsum("bhkv,bhk->bhv", state, qf)
