"""ShortlistHead: a 4-bit proposal lm_head over the most frequent token ids (`--lm-head-draft`).

Imports torch and kernels (dispatch, the int4 GEMV's row limit). Drafting needs only an argmax,
and almost every argmax of a chat model lands in its frequent tokens, so the MTP head's drafts can
read a smaller, coarser lm_head: the first `size` (default 131,072) sampleable ids, taking the
byte-level BPE merge order as the frequency proxy (Qwen's vocabulary assigns ids in merge order,
so a lower id is an earlier, more frequent merge), quantized to 4 bits per weight with one scale
per group of 64 along the hidden size (symmetric: q in -8..7, w ~ q * scale). Verification always
uses the full lm_head, so the shortlist changes which drafts are proposed, never what is
committed.

Logits are fp32 (hidden converted to fp32; kernels/int4_gemv/reference.py states the rounding).
On a GPU the fused int4 GEMV (kernels/int4_gemv) reads the packed nibbles and scales directly,
MAX_ROWS hidden rows per launch (a proposal of more rows loops over chunks), and no dequantized
copy is kept: a proposal reads R * H / 2 + R * H / 16 bytes (377 MB at 131,072 x 5120), a quarter
of the bf16 rows' 1.34 GB. Where the kernel cannot serve at construction (NINFER_KERNELS=torch,
`int4_gemv` in NINFER_KERNELS_OFF, no CuPy, a dtype or shape it does not take), the dequantized
rows are kept in the compute dtype and read by F.linear, as before the kernel. On the CPU the
torch twin runs (exact fp32, no copy kept).
NOTE: the kernel multiplies in fp32 on CUDA cores, about M FMAs per weight for M rows, so it is
FMA-bound from a few rows up. Measured on an H200 (2026-12-03, `python -m ninfer.bench.
kernel_bench --int4-rows 1,8`, 131,072 x 5,120): 1 row 130.8 us (2.4x faster than bf16 F.linear
over the dequantized rows, 313.2 us), 8 rows 467.7 us (0.68x of F.linear's 316.3 us). Proposals
of more than ~4 rows (a head pass over more than ~4 sequences) are therefore slower than the
dequantized path was; a row threshold over a kept copy, or a tensor-core variant (bf16 x), is
the fix, not yet made.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch
from ninfer.kernels.int4_gemv.launch import MAX_ROWS

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
        # hidden states arrive in the lm_head's dtype: a one-row probe of that dtype decides
        probe = torch.empty((1, lm_head.shape[1]), dtype=lm_head.dtype, device=lm_head.device)
        self.fused = lm_head.is_cuda and dispatch.int4_linear_available(
            probe, self.packed, self.scale
        )
        # only a GPU without the kernel keeps the dequantized rows (today's F.linear path)
        self.weight: torch.Tensor | None = None
        if lm_head.is_cuda and not self.fused:
            self.weight = dequantize_int4(self.packed, self.scale, lm_head.dtype)

    @property
    def size(self) -> int:
        return self.ids.shape[0]

    def propose(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] final-normed hidden states -> [N] proposed token ids."""
        if self.weight is not None:  # a GPU where the kernel does not serve
            logits = F.linear(hidden.to(self.weight.dtype), self.weight)
            return self.ids[logits.float().argmax(dim=-1)]
        if not self.fused or hidden.shape[0] <= MAX_ROWS:  # the CPU twin, or one launch
            return self.ids[dispatch.int4_linear(hidden, self.packed, self.scale).argmax(dim=-1)]
        picks = [
            dispatch.int4_linear(p, self.packed, self.scale).argmax(dim=-1)
            for p in hidden.split(MAX_ROWS)
        ]
        return self.ids[torch.cat(picks)]
