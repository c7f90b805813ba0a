"""Torch twins of the KV quantize-on-store and dequantizing page reads, one definition per format.

Imports only torch and this op's formats. The rounding is spelled out so the CUDA kernels can
match it bit for bit: scales are amax divided by a tensor (CUDA torch turns a division by a Python
number into a product with its reciprocal; the kernels divide correctly rounded), values are
rounded to nearest even (int8 by `torch.round`, e4m3 by torch's own cast, e2m1 by the threshold
table below). Dequantized values are computed in fp32 (code * scale, for nvfp4 code * (block
scale * row scale)), then rounded once to the caller's dtype.
"""

from __future__ import annotations

import torch

from ninfer.kernels.kv_quant.formats import (
    FP8,
    INT8,
    NVFP4,
    NVFP4_BLOCK,
    KvPages,
    QuantPages,
)

INT8_MAX = 127.0
E4M3_MAX = 448.0
E2M1_MAX = 6.0
# e2m1 magnitudes by code (the sign is bit 3)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Round-to-nearest-even into E2M1_VALUES: code = number of thresholds passed, where a tie goes to
# the even code (0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2, 3.5 -> 4, 5 -> 4):
# "> t" thresholds round their tie down, ">= t" ones round it up.
_E2M1_GT = (0.25, 1.25, 2.5, 5.0)
_E2M1_GE = (0.75, 1.75, 3.5)

# Round-trip error bounds per value x of a row with amax A (tests state and check these):
#   int8:  |x - x'| <= A / 254 (half a step of A / 127)
#   fp8:   |x - x'| <= 2^-4 |x| + 2^-10 A / 448 (3 mantissa bits; half the subnormal step)
#   nvfp4: |x - x'| <= (1 + 2^-4) B / 6 with B the amax of x's block of 16 (half the widest
#          e2m1 gap, 4 -> 6, times the block scale, itself e4m3-rounded from B / 6)
INT8_ROW_ERROR = 1.0 / 254.0
FP8_REL_ERROR = 2.0**-4
NVFP4_BLOCK_ERROR = (1.0 + 2.0**-4) / 6.0


def _divide(num: torch.Tensor, den: float) -> torch.Tensor:
    return num / torch.full_like(num, den)


def _row_scale(amax: torch.Tensor, top: float) -> torch.Tensor:
    """amax / top, or 1 for an all-zero row (so a zero row stores zeros, not NaN)."""
    return torch.where(amax > 0, _divide(amax, top), torch.ones_like(amax))


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """fp32 values (already divided by their scale) -> uint8 e2m1 codes 0..15, sign in bit 3."""
    a = v.abs()
    code = torch.zeros(v.shape, dtype=torch.uint8, device=v.device)
    for t in _E2M1_GT:
        code += (a > t).to(torch.uint8)
    for t in _E2M1_GE:
        code += (a >= t).to(torch.uint8)
    return code | ((v < 0).to(torch.uint8) << 3)


def e2m1_values(code: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes -> fp32 values."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=code.device)
    mag = table[(code & 7).long()]
    return torch.where((code & 8) != 0, -mag, mag)


def quantize(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Rows of D values -> (values, scale, block_scale) in `fmt`'s storage layout.

    Args:
        x: [..., D] bf16 or fp32 (D a multiple of 16 for nvfp4).
    Returns:
        values [..., D] int8 / uint8 (e4m3 bytes) or [..., D/2] uint8 (nvfp4); scale [...] fp32;
        block_scale [..., D/16] uint8 e4m3 bytes for nvfp4, else None.
    """
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    if fmt == INT8:
        scale = _row_scale(amax, INT8_MAX)
        q = torch.round(xf / scale[..., None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
        return q, scale, None
    if fmt == FP8:
        scale = _row_scale(amax, E4M3_MAX)
        q = (xf / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        return q.view(torch.uint8), scale, None
    if fmt == NVFP4:
        scale = _row_scale(amax, E2M1_MAX * E4M3_MAX)
        blocks = xf.unflatten(-1, (-1, NVFP4_BLOCK))  # [..., D] -> [..., D/16, 16]
        bamax = blocks.abs().amax(dim=-1)
        denom = scale[..., None] * E2M1_MAX
        block = (bamax / denom).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)
        eff = block.float() * scale[..., None]  # [..., D/16]
        safe = torch.where(eff > 0, eff, torch.ones_like(eff))
        v = torch.where(eff[..., None] > 0, blocks / safe[..., None], torch.zeros_like(blocks))
        codes = e2m1_codes(v.clamp(-E2M1_MAX, E2M1_MAX)).flatten(-2)  # [..., D]
        packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
        return packed, scale, block.view(torch.uint8)
    raise ValueError(f"unknown KV format {fmt!r}")


def dequantize(
    values: torch.Tensor, scale: torch.Tensor, block_scale: torch.Tensor | None, fmt: str
) -> torch.Tensor:
    """The fp32 rows [..., D] that `quantize` stored."""
    if fmt == INT8:
        return values.float() * scale[..., None]
    if fmt == FP8:
        return values.view(torch.float8_e4m3fn).float() * scale[..., None]
    if fmt == NVFP4:
        assert block_scale is not None
        codes = torch.stack((values & 15, values >> 4), dim=-1).flatten(-2)  # [..., D]
        eff = block_scale.view(torch.float8_e4m3fn).float() * scale[..., None]  # [..., D/16]
        vals = e2m1_values(codes).unflatten(-1, (-1, NVFP4_BLOCK)) * eff[..., None]
        return vals.flatten(-2)
    raise ValueError(f"unknown KV format {fmt!r}")


def read_pages(pages: KvPages, index: tuple[torch.Tensor, ...], dtype: torch.dtype) -> torch.Tensor:
    """pages[index] dequantized to `dtype` (plain pages: just indexed and cast).

    `index` indexes the leading dims of every page tensor alike: (page_ids,) gives
    [..., P, Hk, D], (page_ids, offsets) gives [..., Hk, D].
    """
    if not isinstance(pages, QuantPages):
        return pages[index].to(dtype)
    block = None if pages.block_scale is None else pages.block_scale[index]
    rows = dequantize(pages.values[index], pages.scale[index], block, pages.fmt)
    return rows.to(dtype)


def store_kv(x: torch.Tensor, pages: KvPages, slot_mapping: torch.Tensor) -> None:
    """Write new rows into their flat slots (page * P + offset), quantizing them first.

    Args:
        x: [T, Hk, D]; pages: [num_pages, P, Hk, D] plain or quantized; slot_mapping: [T] int64.
    """
    if not isinstance(pages, QuantPages):
        num_kv_heads, head_dim = pages.shape[2:]
        flat = pages.view(-1, num_kv_heads, head_dim)
        flat.index_copy_(0, slot_mapping, x.to(pages.dtype))
        return
    values, scale, block = quantize(x, pages.fmt)
    for dst, src in ((pages.values, values), (pages.scale, scale), (pages.block_scale, block)):
        if dst is not None and src is not None:
            dst.flatten(0, 1).index_copy_(0, slot_mapping, src)


def gather_pages(pages: KvPages, page_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The pages `page_ids` [n] as a dequantized [n, P, Hk, D] tensor in `dtype` (what prefill
    attention reads; the CUDA twin fuses the gather and the dequantization)."""
    return read_pages(pages, (page_ids,), dtype)
