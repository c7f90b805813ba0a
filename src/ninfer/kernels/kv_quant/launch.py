"""CUDA launchers of the KV store (quantize on append) and the page gather (dequantize).

Imports torch, kernels.runtime and this op's formats. Same bytes and values as `reference`
where `supports_store` / `supports_gather` say yes; plain (unquantized) pages never come here.
Both launches depend only on host shapes, so they are captured by decode graphs as they are.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.kv_quant import formats as kvf
from ninfer.kernels.kv_quant.formats import QuantPages

OP = "kv_quant"
HEADERS = ("kv_quant/kv_codec.cu",)
WARPS = 4  # rows per block, one warp each
FORMAT_CODES = {kvf.INT8: 1, kvf.FP8: 2, kvf.NVFP4: 3}
MAX_HEAD_DIM = 512  # a lane holds D / 32 values


def _head_dim_ok(fmt: str, head_dim: int) -> bool:
    """D a multiple of 32 up to 512; nvfp4: a lane's D/32 dims inside one 16-value block."""
    if head_dim % 32 or not 32 <= head_dim <= MAX_HEAD_DIM:
        return False
    return fmt != kvf.NVFP4 or 16 % (head_dim // 32) == 0


def _pages_ok(pages: QuantPages) -> bool:
    return pages.fmt in FORMAT_CODES and all(t.is_contiguous() for t in pages.tensors())


def supports_store(x: torch.Tensor, pages: QuantPages) -> bool:
    """x [T, Hk, D] bf16/fp32 with unit stride in D, pages of the same head layout."""
    return (
        x.dim() == 3
        and x.dtype in rt.CUDA_TYPES
        and x.stride(-1) == 1
        and tuple(x.shape[1:]) == tuple(pages.shape[2:])
        and _head_dim_ok(pages.fmt, pages.head_dim)
        and _pages_ok(pages)
    )


def supports_gather(pages: QuantPages, dtype: torch.dtype) -> bool:
    return dtype in rt.CUDA_TYPES and _head_dim_ok(pages.fmt, pages.head_dim) and _pages_ok(pages)


def store_kv(x: torch.Tensor, pages: QuantPages, slot_mapping: torch.Tensor) -> None:
    """See `reference.store_kv`."""
    device = rt.check_cuda(x, slot_mapping, *pages.tensors())
    if not supports_store(x, pages):
        raise rt.KernelInputError(
            f"kv store does not take x {tuple(x.shape)} {x.dtype} into {pages.fmt} pages "
            f"{tuple(pages.shape)}"
        )
    num_tokens, num_heads, head_dim = x.shape
    if slot_mapping.shape != (num_tokens,):
        raise rt.KernelInputError(
            f"{tuple(slot_mapping.shape)} slots for {num_tokens} rows: one slot per row"
        )
    if num_tokens == 0:
        return
    slots = slot_mapping.to(torch.int64).contiguous()
    instance = f"kv_store<{rt.cuda_type(x, 'x')}, {FORMAT_CODES[pages.fmt]}, {head_dim // 32}>"
    kernel = rt.get_kernel(OP, instance, device, HEADERS)
    args = (
        rt.ptr(pages.values),
        rt.ptr(pages.scale),
        rt.ptr(pages.block_scale),
        rt.ptr(x),
        rt.i64(x.stride(0)),
        rt.i64(x.stride(1)),
        rt.ptr(slots),
        rt.i32(num_tokens),
        rt.i32(num_heads),
    )
    grid = (-(-num_tokens * num_heads // WARPS),)
    rt.launch(kernel, grid, (32 * WARPS,), args, device)


def gather_pages(pages: QuantPages, page_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """See `reference.gather_pages`: [n, P, Hk, D] in `dtype`."""
    device = rt.check_cuda(page_ids, *pages.tensors())
    if not supports_gather(pages, dtype):
        raise rt.KernelInputError(f"kv gather does not take {pages.fmt} pages {pages.shape}")
    _, page_size, num_heads, head_dim = pages.shape
    ids = page_ids.to(torch.int64).contiguous()
    out = torch.empty((*ids.shape, page_size, num_heads, head_dim), dtype=dtype, device=device)
    num_rows = ids.numel() * page_size * num_heads
    if num_rows == 0:
        return out
    instance = f"kv_gather<{rt.CUDA_TYPES[dtype]}, {FORMAT_CODES[pages.fmt]}, {head_dim // 32}>"
    kernel = rt.get_kernel(OP, instance, device, HEADERS)
    args = (
        rt.ptr(out),
        rt.ptr(pages.values),
        rt.ptr(pages.scale),
        rt.ptr(pages.block_scale),
        rt.ptr(ids),
        rt.i64(num_rows),
        rt.i32(page_size * num_heads),
    )
    grid = (-(-num_rows // WARPS),)
    rt.launch(kernel, grid, (32 * WARPS,), args, device)
    return out
