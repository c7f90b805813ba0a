"""Counter-based randomness for sampling: Philox4x32-10 and the uniforms the sampler draws.

Imports only torch. Keyed by the request's seed and counted by (lane, step, purpose), so a draw
never depends on batch neighbours or launch order; sampling.cu restates the same function word for
word, and the Random123 known answers pin both.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import torch

_MASK32 = 0xFFFFFFFF
_PHILOX_M0, _PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
_PHILOX_W0, _PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
_PHILOX_ROUNDS = 10


class RngPurpose(enum.IntEnum):
    """Counter word 3: separates draw streams that share (seed, step, lane).

    Speculative decoding's acceptance test and residual draw need their own streams; they are
    registered here so no two users of the RNG collide.
    """

    SAMPLE = 0
    SPEC_ACCEPT = 1
    SPEC_RESIDUAL = 2


def _mulhilo32(a: torch.Tensor, multiplier: int) -> tuple[torch.Tensor, torch.Tensor]:
    # a holds uint32 values in int64 lanes. Splitting the multiplier in 16-bit halves keeps every
    # partial product below 2**49, so nothing relies on signed overflow wrapping.
    m_hi, m_lo = multiplier >> 16, multiplier & 0xFFFF
    low_part = a * m_lo
    mid = a * m_hi + (low_part >> 16)
    return mid >> 16, ((mid & 0xFFFF) << 16) | (low_part & 0xFFFF)


def philox4x32_10(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Philox4x32-10 (Salmon et al. 2011; Random123's constants and known answers).

    Args:
        counter: [..., 4] int64 holding uint32 words.
        key: [..., 2] int64 holding uint32 words, broadcastable against counter[..., 0].
    Returns:
        [..., 4] int64 holding the uint32 output words.
    """
    c0, c1, c2, c3 = counter.unbind(-1)
    k0, k1 = key.unbind(-1)
    for round_idx in range(_PHILOX_ROUNDS):
        if round_idx:
            k0 = (k0 + _PHILOX_W0) & _MASK32
            k1 = (k1 + _PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo32(c0, _PHILOX_M0)
        hi1, lo1 = _mulhilo32(c2, _PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack((c0, c1, c2, c3), dim=-1)


def counter_uniforms(
    seeds: torch.Tensor,
    steps: torch.Tensor,
    lanes: torch.Tensor,
    purpose: RngPurpose,
    philox: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Uniforms in the open interval (0, 1), one per (row, lane), from word 0 of Philox.

    Key = the seed's two's-complement words (low, high); counter = (lane, step low, step high,
    purpose). The value is (x + 0.5) / 2**32 in float64, exact and never 0 or 1.

    Args:
        seeds: [B] int64 signed seeds.
        steps: [B] int64 non-negative step indices.
        lanes: [B, N] int64 lane ids below 2**32 (the sampler uses token ids).
        philox: the generator on ([B, N, 4] counters, [B, 1, 2] keys); None is this module's
            torch `philox4x32_10` (dispatch passes the kernel's, the same words in one launch).
    Returns:
        [B, N] float64.
    """
    key = torch.stack((seeds & _MASK32, (seeds >> 32) & _MASK32), dim=-1)[:, None, :]  # [B, 1, 2]
    step_lo = (steps & _MASK32)[:, None].expand_as(lanes)
    step_hi = ((steps >> 32) & _MASK32)[:, None].expand_as(lanes)
    counter = torch.stack(
        (lanes, step_lo, step_hi, torch.full_like(lanes, int(purpose))), dim=-1
    )  # [B, N, 4]
    words = (philox or philox4x32_10)(counter, key)
    return (words[..., 0].to(torch.float64) + 0.5) * 2.0**-32
