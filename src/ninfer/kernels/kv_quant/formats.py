"""KV-cache storage formats: what `--kv-dtype` names, how each format lays out its page tensors.

Imports only torch. A full-attention layer's K (or V) pages are either a plain tensor
[num_pages, P, Hk, D] in the model dtype (`bf16`, the unquantized cache) or a `QuantPages`: the
coded values plus per-(token, head) scales, every tensor page-major so a page copy (prefix-cache
COW tail, host snapshot) is the same `index_select` on each of them. Per-(token, head) scales
keep the store a pure per-row function of the new token (no page-wide rescale when a page fills
up) and let a copied page carry its own scales.

Formats of one tensor (K or V), bytes per (token, head) of D values:
  int8   symmetric int8, fp32 scale amax / 127                         D + 4
  fp8    e4m3 bytes, fp32 scale amax / 448                              D + 4
  nvfp4  packed e2m1 nibbles, e4m3 scale per 16 values, fp32 row scale  D / 2 + D / 16 + 4
`--kv-dtype` picks a pair: bf16, int8, fp8, nvfp4 (both K and V) or k8v4 (fp8 K, nvfp4 V; keys
drive the softmax, where 4 bits cost most, values are averaged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch

PLAIN = "plain"  # the model dtype, unquantized
INT8, FP8, NVFP4 = "int8", "fp8", "nvfp4"
QUANT_FORMATS = (INT8, FP8, NVFP4)
NVFP4_BLOCK = 16  # values per e4m3 block scale

# --kv-dtype -> (K format, V format)
KV_DTYPES: dict[str, tuple[str, str]] = {
    "bf16": (PLAIN, PLAIN),
    "int8": (INT8, INT8),
    "fp8": (FP8, FP8),
    "nvfp4": (NVFP4, NVFP4),
    "k8v4": (FP8, NVFP4),
}


class KvDtypeError(ValueError):
    """An unknown `--kv-dtype`, or a head dim the format cannot pack."""


def kv_formats(kv_dtype: str) -> tuple[str, str]:
    """(K format, V format) of a `--kv-dtype` name, or a KvDtypeError listing the known ones."""
    try:
        return KV_DTYPES[kv_dtype]
    except KeyError:
        known = "|".join(KV_DTYPES)
        raise KvDtypeError(f"unknown kv dtype {kv_dtype!r}; expected one of {known}") from None


@dataclass(frozen=True)
class QuantPages:
    """One layer's K or V pages in a quantized format (all tensors page-major).

    values: int8 [N, P, Hk, D] (int8), uint8 [N, P, Hk, D] e4m3 bytes (fp8), or uint8
        [N, P, Hk, D/2] two e2m1 codes per byte, element 2i in the low nibble (nvfp4).
    scale: [N, P, Hk] fp32, the per-(token, head) scale.
    block_scale: [N, P, Hk, D/16] uint8 e4m3 bytes (nvfp4 only), else None.
    """

    fmt: str
    values: torch.Tensor
    scale: torch.Tensor
    block_scale: torch.Tensor | None = None

    @property
    def head_dim(self) -> int:
        return self.values.shape[3] * (2 if self.fmt == NVFP4 else 1)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """The logical [N, P, Hk, D] shape, as a plain page tensor would have it."""
        n, p, h, _ = self.values.shape
        return (n, p, h, self.head_dim)

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def is_cuda(self) -> bool:
        return self.values.is_cuda

    def tensors(self) -> list[torch.Tensor]:
        """Every page-indexed tensor (what a page copy must move)."""
        return [t for t in (self.values, self.scale, self.block_scale) if t is not None]


KvPages = Union[torch.Tensor, QuantPages]  # noqa: UP007 (a runtime alias, used in isinstance)


def page_tensors(pages: KvPages) -> list[torch.Tensor]:
    """The tensors of one layer's K or V pages, plain or quantized."""
    return pages.tensors() if isinstance(pages, QuantPages) else [pages]


def check_head_dim(fmt: str, head_dim: int) -> None:
    """nvfp4 packs two values per byte and scales blocks of 16: D must be a multiple of 16."""
    if fmt == NVFP4 and head_dim % NVFP4_BLOCK:
        raise KvDtypeError(f"nvfp4 KV needs a head dim that is a multiple of 16, got {head_dim}")


def allocate(
    fmt: str,
    shape: tuple[int, int, int, int],
    *,
    dtype: torch.dtype,
    device: torch.device | str,
) -> KvPages:
    """Zero-filled pages of logical `shape` [N, P, Hk, D] (`dtype`: the plain format's dtype).

    Zero values with scale 0 dequantize to 0, never NaN, like the plain cache's zero fill.
    """
    if fmt == PLAIN:
        return torch.zeros(shape, dtype=dtype, device=device)
    check_head_dim(fmt, shape[3])
    n, p, h, d = shape
    scale = torch.zeros((n, p, h), dtype=torch.float32, device=device)
    if fmt == INT8:
        return QuantPages(fmt, torch.zeros(shape, dtype=torch.int8, device=device), scale)
    if fmt == FP8:
        return QuantPages(fmt, torch.zeros(shape, dtype=torch.uint8, device=device), scale)
    if fmt == NVFP4:
        values = torch.zeros((n, p, h, d // 2), dtype=torch.uint8, device=device)
        blocks = torch.zeros((n, p, h, d // NVFP4_BLOCK), dtype=torch.uint8, device=device)
        return QuantPages(fmt, values, scale, blocks)
    raise KvDtypeError(f"unknown KV format {fmt!r}")


def bytes_per_token_head(fmt: str, head_dim: int, dtype: torch.dtype) -> int:
    """Storage of one (token, head) row of D values, scales included."""
    if fmt == PLAIN:
        return head_dim * torch.empty((), dtype=dtype).element_size()
    if fmt in (INT8, FP8):
        return head_dim + 4
    if fmt == NVFP4:
        return head_dim // 2 + head_dim // NVFP4_BLOCK + 4
    raise KvDtypeError(f"unknown KV format {fmt!r}")


def bytes_per_token(kv_dtype: str, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """K and V of one token in one full-attention layer."""
    k_fmt, v_fmt = kv_formats(kv_dtype)
    per_head = bytes_per_token_head(k_fmt, head_dim, dtype)
    per_head += bytes_per_token_head(v_fmt, head_dim, dtype)
    return num_kv_heads * per_head
