"""Torch twin of the MTP front kernel: what the head's pass starts with before `fc`.

Imports torch and the add_rms_norm twin. Four ops (the embedding gather, two norms, the
concatenation), each a launch and a dependency inside a speculative round's graph, three passes a
round; the kernel does them in one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ninfer.kernels.add_rms_norm.reference import add_rms_norm

Norm = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return add_rms_norm(x, None, weight, eps)[0]


def mtp_front(
    ids: torch.Tensor,
    embed: torch.Tensor,
    hidden: torch.Tensor,
    embed_norm: torch.Tensor,
    hidden_norm: torch.Tensor,
    eps: float,
    *,
    rms_norm: Norm = _rms_norm,
) -> torch.Tensor:
    """[rms_norm(embed[ids]) | rms_norm(hidden)] (zero-centred norms, as `add_rms_norm`).

    Args:
        ids: [T] int64 token ids; embed: [V, H]; hidden: [T, H] (cast to embed's dtype);
        embed_norm, hidden_norm: [H].
        rms_norm: the norm (x, weight, eps) -> normed x: the twin's, or dispatch's when it runs
            these ops in place of the kernel (the norms then on their CUDA kernel).
    Returns:
        [T, 2H] in embed's dtype.
    """
    rows = F.embedding(ids, embed)
    normed = (rms_norm(rows, embed_norm, eps), rms_norm(hidden.to(rows.dtype), hidden_norm, eps))
    return torch.cat(normed, dim=-1)
