"""ShortlistHead: a 4-bit proposal lm_head over the most frequent token ids (`--lm-head-draft`).

Imports torch only. Drafting needs only an argmax, and almost every argmax of a chat model lands
in its frequent tokens, so the MTP head's drafts can read a smaller, coarser lm_head: the first
`size` (default 131,072) sampleable ids, taking the byte-level BPE merge order as the frequency
proxy (Qwen's vocabulary assigns ids in merge order, so a lower id is an earlier, more frequent
merge), quantized to 4 bits per weight with one scale per group of 64 along the hidden size
(symmetric: q in -8..7, w ~ q * scale). Verification always uses the full lm_head, so the
shortlist changes which drafts are proposed, never what is committed.
NOTE: the torch path keeps the dequantized rows (compute dtype) beside the packed nibbles; a
fused int4 GEMV reading the packed form is not built, so on the GPU the proposal reads about
half the bytes of the full head (131,072 of 248,320 rows), not a quarter.
"""

from __future__ import annotations

import torch

DEFAULT_SIZE = 131072
GROUP = 64


def quantize_int4(weight: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, H] -> (packed uint8 [N, H / 2]: element 2i in the low nibble, 2i + 1 in the high one,
    each stored as q + 8; fp32 scales [N, H / group])."""
    rows, hidden = weight.shape
    if hidden % group or group % 2:
        raise ValueError(f"hidden size {hidden} is not a multiple of the group {group}")
    w = weight.float().reshape(rows, hidden // group, group)
    scale = w.abs().amax(-1) / 7.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[..., None]).clamp(-8, 7).to(torch.int16) + 8
    q = q.reshape(rows, hidden).to(torch.uint8)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)
    return packed, scale


def dequantize_int4(
    packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, group: int = GROUP
) -> torch.Tensor:
    """The inverse of `quantize_int4` up to its rounding: [N, H] in `dtype`."""
    rows = packed.shape[0]
    low = (packed & 0xF).to(torch.int16) - 8
    high = (packed >> 4).to(torch.int16) - 8
    q = torch.stack((low, high), dim=-1).reshape(rows, -1).float()
    w = q.reshape(rows, -1, group) * scale[..., None]
    return w.reshape(rows, -1).to(dtype)


class ShortlistHead:
    """Proposals over the shortlist: row r is token id `ids[r]` (ascending, so the lowest id
    wins a tie, as the full head's argmax)."""

    def __init__(self, lm_head: torch.Tensor, num_sampleable: int, size: int | None = None):
        """`size`: the shortlist's length (None: DEFAULT_SIZE)."""
        size = DEFAULT_SIZE if size is None else size
        count = min(size, num_sampleable, lm_head.shape[0])
        self.ids = torch.arange(count, device=lm_head.device)
        self.packed, self.scale = quantize_int4(lm_head[:count])
        self.weight = dequantize_int4(self.packed, self.scale, lm_head.dtype)

    @property
    def size(self) -> int:
        return self.ids.shape[0]

    def propose(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] final-normed hidden states -> [N] proposed token ids."""
        logits = torch.nn.functional.linear(hidden.to(self.weight.dtype), self.weight)
        return self.ids[logits.float().argmax(dim=-1)]
