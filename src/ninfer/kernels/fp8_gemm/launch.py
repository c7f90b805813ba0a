"""CUDA side of the fp8 prefill GEMM: block-scaled `torch._scaled_mm`, or dequantize + cuBLAS.

Imports torch, kernels.runtime and this op's twin. SCALED_MM (x quantized per 1x128 group by a
kernel, weights read as e4m3 with their 128x128 scales) where it works, else DEQUANTIZE (one kernel
into a scratch copy, then cuBLAS). Blockwise support is probed once per device with a small checked
call: it depends on torch, cuBLAS and the GPU in ways no version number states reliably.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ninfer.kernels import runtime as rt
from ninfer.kernels.fp8_gemm import reference
from ninfer.kernels.fp8_gemm.reference import BLOCK, Fp8Activations, Fp8Weight

OP = "fp8_gemm"
THREADS = 256
# K must be a multiple of 512: whole 128-column groups (cuBLAS's 1x128 and 128x128 scales) in a
# multiple of 4 (the weight scale rows' 16-byte stride; PyTorch versions disagree on padding it).
K_MULTIPLE = 4 * BLOCK
N_MULTIPLE = 16  # _scaled_mm's rule for mat2's dimensions
ROW_MULTIPLE = 4  # x rows padded so the scales' leading dimension stays 16-byte aligned
MAX_GRID = 1 << 20  # blocks of a grid-stride launch

log = logging.getLogger(__name__)


class GemmPath(enum.Enum):
    SCALED_MM = "scaled_mm"  # quantize x, fp8 x fp8 on tensor cores
    DEQUANTIZE = "dequantize"  # weight expanded to x's dtype, then cuBLAS


@dataclass(frozen=True)
class BlockwiseSupport:
    """What the once-per-device probe of blockwise `torch._scaled_mm` found."""

    on_grid: bool  # N a multiple of 128
    off_grid_n: bool  # N a multiple of 16 only (a short last weight block)
    reason: str  # why not, or "ok"


_support: dict[int, BlockwiseSupport] = {}


def _device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def blockwise_support(device: torch.device) -> BlockwiseSupport | None:
    """The cached probe result for `device`, probing now if needed; None inside a graph capture
    that finds no cached result (probing syncs, so the caller takes the dequantize path)."""
    index = _device_index(device)
    if index not in _support:
        if torch.cuda.is_current_stream_capturing():
            return None
        with torch.cuda.device(index):
            _support[index] = _probe(torch.device("cuda", index))
        log.info("fp8 blockwise _scaled_mm on cuda:%d: %s", index, _support[index])
    return _support[index]


def _probe(device: torch.device) -> BlockwiseSupport:
    if not hasattr(torch, "_scaled_mm"):
        return BlockwiseSupport(False, False, "torch has no _scaled_mm")
    if torch.cuda.get_device_capability(device) < (8, 9):
        return BlockwiseSupport(False, False, "fp8 GEMMs need an sm_89+ GPU")
    gen = torch.Generator().manual_seed(0)
    k = K_MULTIPLE
    x = torch.randn(18, k, generator=gen).to(device=device, dtype=torch.bfloat16)  # 20 padded
    results = []
    for n in (256, 272):  # on the 128 grid, then a short last block
        q = torch.randn(n, k, generator=gen).clamp(-448, 448).to(torch.float8_e4m3fn)
        scale = torch.rand(-(-n // BLOCK), k // BLOCK, generator=gen) + 0.5
        weight = Fp8Weight(q.to(device), scale.to(device))
        try:
            got = fp8_gemm(x, weight)
        except Exception as e:  # any failure (torch, cuBLAS, GPU) means: not here
            results.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        want = reference.fp8_gemm(x, weight).double()
        err = ((got.double() - want).norm() / want.norm()).item()
        results.append("ok" if err < 1e-2 else f"wrong result (relative error {err:.3g})")
    on_grid, off_grid = results[0] == "ok", results[1] == "ok"
    reason = "ok" if on_grid and off_grid else f"N=256: {results[0]}; N=272: {results[1]}"
    return BlockwiseSupport(on_grid, on_grid and off_grid, reason)


def supports(x: torch.Tensor, weight: Fp8Weight) -> bool:
    """Whether `fp8_linear` takes these operands (otherwise dispatch runs the twin)."""
    w, s = weight.weight, weight.scale_inv
    n, k = w.shape
    return (
        x.dtype in rt.CUDA_TYPES
        and x.shape[-1] == k
        and w.dtype == torch.float8_e4m3fn
        and w.is_contiguous()
        and s.dtype == torch.float32
        and s.is_contiguous()
        and tuple(s.shape) == (-(-n // BLOCK), -(-k // BLOCK))
    )


def choose_path(x: torch.Tensor, weight: Fp8Weight) -> GemmPath:
    """The path `fp8_linear` takes for a 2-D x (probing blockwise support on first use)."""
    w, s = weight.weight, weight.scale_inv
    n, k = w.shape
    if not (
        x.dtype == torch.bfloat16
        and k % K_MULTIPLE == 0
        and n % N_MULTIPLE == 0
        and w.is_contiguous()
        and w.data_ptr() % 16 == 0
        and s.is_contiguous()
        and s.data_ptr() % 16 == 0
    ):
        return GemmPath.DEQUANTIZE
    support = blockwise_support(x.device)
    if support is None or not support.on_grid or (n % BLOCK and not support.off_grid_n):
        return GemmPath.DEQUANTIZE
    return GemmPath.SCALED_MM


def fp8_linear(x: torch.Tensor, weight: Fp8Weight) -> torch.Tensor:
    """x @ dequantize(weight).T for prefill-sized x of any leading dims, in x's dtype.

    SCALED_MM matches `reference.fp8_gemm` (x quantized); DEQUANTIZE matches
    `reference.fp8_linear` bit for bit up to cuBLAS. See `choose_path`.
    """
    rt.check_cuda(x, weight.weight, weight.scale_inv)
    if not supports(x, weight):
        raise rt.KernelInputError(
            f"fp8 GEMM needs bf16/fp32 x over K, contiguous e4m3 weights and f32 "
            f"[ceil(N/128), ceil(K/128)] scales; got x {tuple(x.shape)} {x.dtype}, weight "
            f"{tuple(weight.shape)} {weight.weight.dtype}, scales {tuple(weight.scale_inv.shape)}"
        )
    n, k = weight.shape
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if x2.shape[0] == 0:
        return x.new_zeros((*lead, n))
    if choose_path(x2, weight) is GemmPath.SCALED_MM:
        out = fp8_gemm(x2, weight)
    else:
        out = F.linear(x2, dequantize(weight, x2.dtype))
    return out.reshape(*lead, n)


def fp8_gemm(x: torch.Tensor, weight: Fp8Weight) -> torch.Tensor:
    """See `reference.fp8_gemm`: x quantized per 1x128 group, then blockwise `torch._scaled_mm`.

    Raises `KernelInputError` for operands off the GEMM's grid (see `choose_path`); errors of
    `_scaled_mm` itself (an unsupported torch or GPU) propagate.
    """
    device = rt.check_cuda(x, weight.weight, weight.scale_inv)
    n, k = weight.shape
    if x.dim() != 2 or x.dtype != torch.bfloat16 or k % K_MULTIPLE or n % N_MULTIPLE:
        raise rt.KernelInputError(
            f"blockwise fp8 GEMM needs 2-D bf16 x, K % {K_MULTIPLE} == 0 and N % {N_MULTIPLE} "
            f"== 0; got x {tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)}"
        )
    num_rows = x.shape[0]
    act = quantize_activations(x, row_multiple=ROW_MULTIPLE)
    with torch.cuda.device(device):
        out = torch._scaled_mm(
            act.values,
            weight.weight.t(),  # [K, N] column-major: the layout cuBLASLt's fp8 GEMM takes
            act.scales,  # [M_pad, K/128], strides (1, M_pad)
            weight.scale_inv.t(),  # [K/128, ceil(N/128)]; its .t() is the [N/128, K/128] rows
            out_dtype=torch.bfloat16,
        )
    return out[:num_rows]


def quantize_activations(x: torch.Tensor, row_multiple: int = 1) -> Fp8Activations:
    """See `reference.quantize_activations` (same bytes and scales)."""
    device = rt.check_cuda(x)
    if x.dim() != 2 or x.dtype not in rt.CUDA_TYPES or row_multiple < 1:
        raise rt.KernelInputError(
            f"quantize takes 2-D bf16/fp32 x and row_multiple >= 1; got {tuple(x.shape)} "
            f"{x.dtype}, row_multiple={row_multiple}"
        )
    if x.shape[1] and x.stride(1) != 1:
        x = x.contiguous()
    num_rows, k = x.shape
    padded_rows = -(-num_rows // row_multiple) * row_multiple
    num_groups = -(-k // BLOCK)
    values = torch.empty((padded_rows, k), dtype=torch.float8_e4m3fn, device=device)
    scales_t = torch.empty((num_groups, padded_rows), dtype=torch.float32, device=device)
    num_warps = padded_rows * num_groups
    if num_warps:
        width = 4 * x.element_size()  # bytes of a lane's 4-element load
        vec = (
            k % 4 == 0
            and x.data_ptr() % width == 0
            and (x.stride(0) * x.element_size()) % width == 0
        )
        instance = f"quantize_1x128<{rt.cuda_type(x, 'x')}, {'true' if vec else 'false'}>"
        kernel = rt.get_kernel(OP, instance, device)
        args = (
            rt.ptr(values),
            rt.ptr(scales_t),
            rt.ptr(x),
            rt.i64(x.stride(0)),
            rt.i32(num_rows),
            rt.i32(padded_rows),
            rt.i32(k),
            rt.i32(num_groups),
        )
        warps_per_block = THREADS // 32
        grid = (-(-num_warps // warps_per_block),)
        rt.launch(kernel, grid, (THREADS,), args, device)
    return Fp8Activations(values, scales_t.t())


def dequantize(weight: Fp8Weight, dtype: torch.dtype) -> torch.Tensor:
    """See `reference.dequantize_weight` (bit-identical)."""
    device = rt.check_cuda(weight.weight, weight.scale_inv)
    w, s = weight.weight, weight.scale_inv
    n, k = w.shape
    if (
        w.dtype != torch.float8_e4m3fn
        or not w.is_contiguous()
        or s.dtype != torch.float32
        or not s.is_contiguous()
        or tuple(s.shape) != (-(-n // BLOCK), -(-k // BLOCK))
        or dtype not in rt.CUDA_TYPES
    ):
        raise rt.KernelInputError(
            f"dequantize needs contiguous e4m3 [N, K] with contiguous f32 [ceil(N/128), "
            f"ceil(K/128)] scales, to bf16/fp32; got {tuple(w.shape)} {w.dtype}, scales "
            f"{tuple(s.shape)} {s.dtype}, to {dtype}"
        )
    out = torch.empty((n, k), dtype=dtype, device=device)
    if out.numel() == 0:
        return out
    vec = k % 16 == 0 and w.data_ptr() % 16 == 0  # out is fresh, hence aligned
    per_thread = 16 if vec else 1
    blocks = min(MAX_GRID, -(-(n * k // per_thread) // THREADS))
    instance = f"dequantize_128x128<{rt.CUDA_TYPES[dtype]}, {'true' if vec else 'false'}>"
    kernel = rt.get_kernel(OP, instance, device)
    args = (rt.ptr(out), rt.ptr(w), rt.ptr(s), rt.i32(n), rt.i32(k), rt.i32(s.shape[1]))
    rt.launch(kernel, (blocks,), (THREADS,), args, device)
    return out
