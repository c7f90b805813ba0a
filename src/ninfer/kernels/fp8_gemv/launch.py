"""CUDA launcher of the CUDA-core fp8 GEMV (grid: row tiles; every x row in one launch).

Imports torch and kernels.runtime. Same signature and results (to fp32 rounding) as
`reference.fp8_linear` where `supports` says yes: at most MAX_ROWS x rows (a decode batch), K a
multiple of 16, dense aligned operands, an sm_89+ GPU (the e4m3 conversion instruction). Dispatch
prefers the tensor-core kernel (`launch_tc`, sm_90); this one is its fallback.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.fp8_gemv.reference import BLOCK, Fp8Weight

OP = "fp8_gemv"
HEADERS = ("fp8_gemv/tc_common.cu",)  # fp8_gemv.cu's tensor-core kernels need it to compile
ROWS = 4  # output rows per warp (independent 16-byte loads in flight per lane)
THREADS = 128  # 4 warps: N = 5120 still gives 320 blocks over the SMs
MAX_ROWS = 8  # x rows per launch (the largest decode batch the kernel serves)


def supports(x: torch.Tensor, weight: Fp8Weight) -> bool:
    """Whether the kernel takes these operands (otherwise the twin runs)."""
    w, s = weight.weight, weight.scale_inv
    if x.dim() != 2 or x.dtype not in rt.CUDA_TYPES or w.dtype != torch.float8_e4m3fn:
        return False
    k = w.shape[1]
    return (
        1 <= x.shape[0] <= MAX_ROWS
        and x.shape[1] == k
        and k % 16 == 0
        and x.stride(1) == 1
        and (x.stride(0) * x.element_size()) % 16 == 0
        and x.data_ptr() % 16 == 0
        and w.is_contiguous()
        and w.data_ptr() % 16 == 0
        and s.dtype == torch.float32
        and s.is_contiguous()
        and tuple(s.shape) == (-(-w.shape[0] // BLOCK), -(-k // BLOCK))
        and torch.cuda.get_device_capability(x.device) >= (8, 9)
    )


def fp8_linear(x: torch.Tensor, weight: Fp8Weight) -> torch.Tensor:
    """See `reference.fp8_linear`."""
    device = rt.check_cuda(x, weight.weight, weight.scale_inv)
    if not supports(x, weight):
        raise rt.KernelInputError(
            f"fp8 GEMV needs 1..{MAX_ROWS} dense aligned x rows, K % 16 == 0, contiguous e4m3 "
            f"weights with f32 [ceil(N/128), ceil(K/128)] scales and an sm_89+ GPU; got x "
            f"{tuple(x.shape)} {x.dtype}, weight {tuple(weight.shape)} {weight.weight.dtype}"
        )
    n, k = weight.shape
    num_rows = x.shape[0]
    out = torch.empty((num_rows, n), dtype=x.dtype, device=device)
    instance = f"fp8_gemv<{rt.cuda_type(x, 'x')}, {num_rows}, {ROWS}>"
    kernel = rt.get_kernel(OP, instance, device, HEADERS)
    rows_per_block = (THREADS // 32) * ROWS
    args = (
        rt.ptr(out),
        rt.ptr(x),
        rt.i64(x.stride(0)),
        rt.ptr(weight.weight),
        rt.ptr(weight.scale_inv),
        rt.i32(n),
        rt.i32(k),
        rt.i32(weight.scale_inv.shape[1]),
    )
    rt.launch(kernel, (-(-n // rows_per_block),), (THREADS,), args, device)
    return out
