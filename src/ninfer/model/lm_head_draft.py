"""ShortlistHead: a 4-bit proposal lm_head over the most frequent token ids (`--lm-head-draft`).

Imports torch and kernels.dispatch. Drafting needs only an argmax, and almost every argmax of a
chat model lands in its frequent tokens, so the MTP head's drafts can read a smaller, coarser
lm_head: the first `size` (default 131,072) sampleable ids, taking the
byte-level BPE merge order as the frequency proxy (Qwen's vocabulary assigns ids in merge order,
so a lower id is an earlier, more frequent merge), quantized to 4 bits per weight with one scale
per group of 64 along the hidden size (symmetric: q in -8..7, w ~ q * scale). Verification always
uses the full lm_head, so the shortlist changes which drafts are proposed, never what is
committed.

The int4 path's logits are fp32 (hidden converted to fp32; kernels/int4_gemv/reference.py
states the rounding). On a GPU a proposal of at most FUSED_MAX_ROWS rows runs the fused int4
GEMV (kernels/int4_gemv), which reads the packed nibbles and scales directly: R * H / 2 +
R * H / 16 bytes (377 MB at 131,072 x 5120), a quarter of the bf16 rows' 1.34 GB. Larger
proposals (a head pass over more sequences), and every proposal where the kernel cannot serve
(NINFER_KERNELS=torch, `int4_gemv` in NINFER_KERNELS_OFF, no CuPy, a dtype or shape it does not
take), read the dequantized rows, kept in the compute dtype, through F.linear. On the CPU the
torch twin runs (exact fp32, no copy).
NOTE: the threshold and the kept copy (1.34 GB for the 27B) are there because the CUDA-core kernel
multiplies in fp32 and is FMA-bound from a few rows up (docs/perf.md, run S4). With the
tensor-core variant (`int4_mma`, bf16 x, 2..64 rows per launch; measured in run V1: 176 µs at 8
rows, 288 at 32, 476 at 64, against ~330-361 for F.linear over the bf16 copy) a bf16 head sends
every proposal to the int4 kernels and keeps no copy (MMA_SERVES_ALL_ROWS): 1.34 GB of GPU
memory back for a ~0.1 ms slower proposal at 64 rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch

DEFAULT_SIZE = 131072
GROUP = 64
# Proposals of at most this many rows run the int4 GEMV on a GPU; more rows read the dequantized
# bf16 rows through F.linear. Measured (H200, 131,072 x 5,120): the kernel is 2.4x faster at 1
# row and 0.68x at 8 (fp32 CUDA-core multiplies, ~M per weight); the break-even is ~5 rows.
FUSED_MAX_ROWS = 4
# True: where the tensor-core int4 kernel takes the head's dtype (bf16), every proposal runs the
# int4 kernels and no dequantized copy is kept (measured, see the NOTE above).
MMA_SERVES_ALL_ROWS = True


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
    """Proposals over the shortlist: row r is token id r (the first `size` ids, so an argmax
    over the rows is the token id itself, and the lowest id wins a tie, as the full head's
    argmax)."""

    def __init__(self, lm_head: torch.Tensor, num_sampleable: int, size: int | None = None):
        """`size`: the shortlist's length (None: DEFAULT_SIZE)."""
        size = DEFAULT_SIZE if size is None else size
        count = min(size, num_sampleable, lm_head.shape[0])
        self.packed, self.scale = quantize_int4(lm_head[:count])
        # hidden states arrive in the lm_head's dtype: a one-row probe of that dtype decides
        probe = torch.empty((1, lm_head.shape[1]), dtype=lm_head.dtype, device=lm_head.device)
        # (both availability checks are False for CPU tensors)
        self.fused = dispatch.int4_linear_available(probe, self.packed, self.scale)
        self.all_rows = (
            self.fused
            and MMA_SERVES_ALL_ROWS
            and dispatch.int4_mma_available(probe, self.packed, self.scale)
        )
        # a GPU keeps the dequantized rows for proposals the kernel does not serve (faster)
        self.weight: torch.Tensor | None = None
        if (lm_head.is_cuda or self.fused) and not self.all_rows:
            self.weight = dequantize_int4(self.packed, self.scale, lm_head.dtype)

    @property
    def size(self) -> int:
        return self.packed.shape[0]

    def propose(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, H] final-normed hidden states -> [N] proposed token ids."""
        fused = self.fused and (self.all_rows or hidden.shape[0] <= FUSED_MAX_ROWS)
        if self.weight is not None and not fused:  # a GPU: bf16 rows through F.linear
            logits = F.linear(hidden.to(self.weight.dtype), self.weight)
            return logits.float().argmax(dim=-1)
        # the int4 GEMV on a GPU (one launch), the exact fp32 twin on the CPU
        return dispatch.int4_linear(hidden, self.packed, self.scale).argmax(dim=-1)
