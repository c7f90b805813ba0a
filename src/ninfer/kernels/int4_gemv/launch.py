"""CUDA launchers of the int4 GEMV: `int4_gemv` on CUDA cores (fp32 or bf16 x, 1..MAX_ROWS rows;
grid: row tiles of 4 warps x ROWS rows) and `int4_mma` on tensor cores (bf16 x, 1..MMA_MAX_ROWS
rows; grid: 128-row blocks of 8 warps, ceil(M / 8) n-tiles). See int4_gemv.cu for both.

Imports torch and kernels.runtime. Same signature and results (to fp32 rounding) as
`reference.int4_linear` where `supports` says yes: x rows fp32 or bf16, dense and 16-byte
aligned, H a multiple of 64, contiguous 16-byte-aligned packed rows [R, H / 2] and contiguous
fp32 scales [R, H / 64], on an sm_80+ GPU (the L2 prefetch-size load qualifier, bf16 mma). bf16 x
of 1..MMA_MAX_ROWS rows runs the tensor-core kernel unless `tensor_cores=False` (dispatch passes
that unless MMA_ROUTED, for `int4_mma` in NINFER_KERNELS_OFF, and for fewer than MMA_MIN_ROWS
rows); everything else of 1..MAX_ROWS rows the CUDA-core one.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.int4_gemv.reference import GROUP
from ninfer.kernels.switches import switched_off

OP = "int4_gemv"
ROWS = 4  # output rows per warp (16-byte loads in flight per lane per step)
THREADS = 128  # 4 warps per block
MAX_ROWS = 8  # x rows per launch of the CUDA-core kernel
MMA_OP = "int4_mma"
MMA_THREADS = 256  # 8 warps x 16 weight rows per block
MMA_MAX_ROWS = 64  # x rows per launch of the tensor-core kernel (8 n-tiles of 8)
# Whether dispatch runs `int4_mma` (direct launcher calls take it regardless), and from how many
# x rows. Measured (H200, 131,072 x 5,120 shortlist, docs/perf.md run V1): 1 row 163.2 µs against
# 131.7 on CUDA cores; 2 rows 164.0 against 181.9; 8 rows 176.2 against 466.8; 32 rows 288.2;
# 64 rows 475.9 (bf16 F.linear over dequantized rows: ~330 to 361).
MMA_ROUTED = True
MMA_MIN_ROWS = 2
# weight groups loaded ahead per n-tile count (1..8): the deepest ring without spills under sm_90
# ptxas (80..112 registers; nvcc -Xptxas -v, see docs/kernels.md)
MMA_DEPTH = {1: 7, 2: 4, 3: 4, 4: 4, 5: 4, 6: 4, 7: 4, 8: 2}


def uses_mma(x: torch.Tensor, tensor_cores: bool = True) -> bool:
    """Whether x (once `supports` says yes) runs the tensor-core kernel: bf16, 1..64 rows."""
    return (
        tensor_cores
        and x.dim() == 2
        and x.dtype == torch.bfloat16
        and 1 <= x.shape[0] <= MMA_MAX_ROWS
    )


def _problem(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, tensor_cores: bool = True
) -> str | None:
    """Why neither kernel can take these operands, or None when one can."""
    if x.dim() != 2:
        return f"x must be [M, H], got shape {tuple(x.shape)}"
    if x.dtype not in rt.CUDA_TYPES:
        return f"x has dtype {x.dtype}; the int4 GEMV takes float32 or bfloat16"
    num_rows, hidden = x.shape
    if not uses_mma(x, tensor_cores) and not 1 <= num_rows <= MAX_ROWS:
        limit = f"1..{MMA_MAX_ROWS} of bf16 (tensor cores), " if tensor_cores else ""
        return (
            f"x has {num_rows} rows of {x.dtype}; the int4 GEMV takes {limit}1..{MAX_ROWS} "
            "(loop over chunks)"
        )
    if hidden % GROUP:
        return f"hidden size {hidden} is not a multiple of the scale group {GROUP}"
    if packed.dtype != torch.uint8 or packed.dim() != 2 or 2 * packed.shape[1] != hidden:
        return (
            f"packed must be uint8 [R, {hidden // 2}] for x {tuple(x.shape)}, got "
            f"{packed.dtype} {tuple(packed.shape)}"
        )
    if packed.shape[0] < 1:
        return "packed has no rows"
    want = (packed.shape[0], hidden // GROUP)
    if scale.dtype != torch.float32 or tuple(scale.shape) != want:
        return f"scale must be float32 {want}, got {scale.dtype} {tuple(scale.shape)}"
    if x.stride(1) != 1 or x.data_ptr() % 16:
        return "x rows must be dense and 16-byte aligned"
    if num_rows > 1 and (x.stride(0) * x.element_size()) % 16:
        return f"x row stride {x.stride(0)} is not a multiple of 16 bytes"
    if not packed.is_contiguous() or packed.data_ptr() % 16:
        return "packed must be contiguous and 16-byte aligned"
    if not scale.is_contiguous():
        return "scale must be contiguous"
    devices = {x.device, packed.device, scale.device}
    if len(devices) != 1 or x.device.type != "cuda":
        return f"operands must share one CUDA device, got {sorted(map(str, devices))}"
    if torch.cuda.get_device_capability(x.device) < (8, 0):
        return "the int4 GEMV needs an sm_80+ GPU"
    return None


def supports(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, tensor_cores: bool = True
) -> bool:
    """Whether a kernel takes these operands (otherwise the twin runs)."""
    return _problem(x, packed, scale, tensor_cores) is None


def int4_linear(
    x: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor, tensor_cores: bool = True
) -> torch.Tensor:
    """See `reference.int4_linear`: [M, R] float32. bf16 x of 1..64 rows runs `int4_mma` unless
    `tensor_cores` is False."""
    device = rt.check_cuda(x, packed, scale)
    problem = _problem(x, packed, scale, tensor_cores)
    if problem is not None:
        raise rt.KernelInputError(f"int4 GEMV: {problem}")
    num_rows, hidden = x.shape
    rows = packed.shape[0]
    out = torch.empty((num_rows, rows), dtype=torch.float32, device=device)
    if uses_mma(x, tensor_cores):
        n_tiles = -(-num_rows // 8)
        l1_scales = "false" if switched_off("int4_mma_l1_scales") else "true"
        instance = f"int4_mma<{n_tiles}, {MMA_DEPTH[n_tiles]}, {l1_scales}>"
        kernel = rt.get_kernel(OP, instance, device)
        args = (
            rt.ptr(out),
            rt.ptr(x),
            rt.i64(x.stride(0)),
            rt.i32(num_rows),
            rt.ptr(packed),
            rt.ptr(scale),
            rt.i32(rows),
            rt.i32(hidden),
        )
        rt.launch(kernel, (-(-rows // 128),), (MMA_THREADS,), args, device)
        return out
    instance = f"int4_gemv<{rt.cuda_type(x, 'x')}, {num_rows}, {ROWS}>"
    kernel = rt.get_kernel(OP, instance, device)
    rows_per_block = (THREADS // 32) * ROWS
    args = (
        rt.ptr(out),
        rt.ptr(x),
        rt.i64(x.stride(0)),
        rt.ptr(packed),
        rt.ptr(scale),
        rt.i32(rows),
        rt.i32(hidden),
    )
    rt.launch(kernel, (-(-rows // rows_per_block),), (THREADS,), args, device)
    return out
