"""Torch twin of the MTP front kernel: what the head's pass starts with before `fc`.

Imports torch and the add_rms_norm twin. Four ops (the embedding gather, two norms, the
concatenation), each a launch and a dependency inside a speculative round's graph, three passes a
round; the kernel does them in one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.kernels.add_rms_norm.reference import add_rms_norm


def mtp_front(
    ids: torch.Tensor,
    embed: torch.Tensor,
    hidden: torch.Tensor,
    embed_norm: torch.Tensor,
    hidden_norm: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """[rms_norm(embed[ids]) | rms_norm(hidden)] (zero-centred norms, as `add_rms_norm`).

    Args:
        ids: [T] int64 token ids; embed: [V, H]; hidden: [T, H] (cast to embed's dtype);
        embed_norm, hidden_norm: [H].
    Returns:
        [T, 2H] in embed's dtype.
    """
    rows = F.embedding(ids, embed)
    return torch.cat(
        (
            add_rms_norm(rows, None, embed_norm, eps)[0],
            add_rms_norm(hidden.to(rows.dtype), None, hidden_norm, eps)[0],
        ),
        dim=-1,
    )
