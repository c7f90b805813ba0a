"""CUDA launcher of `fp8_split_gemv`: fp8 block-scaled weights, one or two bf16 x rows, laid out
like the bf16 GEMV (grid: row tiles; K split across the warps of a block).

Imports torch and kernels.runtime. Same signature and results (to fp32 rounding; bf16 output) as
`fp8_gemv.reference.fp8_linear` where `supports` says yes: 1..MAX_ROWS dense 16-byte-aligned bf16
x rows, K a multiple of 16, contiguous e4m3 weights with f32 [ceil(N/128), ceil(K/128)] scales, an
sm_80+ GPU. Opt-in (`NINFER_KERNELS_ON=fp8_split`): the 27B fp8 step measured it slower than the
tensor-core ring at one row on an H100 (S33) and on an H200 (S36B: 10.30 against 8.76 ms); why it
might have won is in the .cu's header.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.bf16_gemv import launch as bf16_launch
from ninfer.kernels.fp8_gemv.reference import BLOCK, Fp8Weight

OP = "fp8_split_gemv"
# bf16_gemv.cu for the grid's helpers and reduction constants, fp8_gemv.cu (with the tc header it
# needs) for the e4m3 -> f16 decode
HEADERS = ("bf16_gemv/bf16_gemv.cu", "fp8_gemv/tc_common.cu", "fp8_gemv/fp8_gemv.cu")
MAX_ROWS = 2  # x rows per launch: from 3 up the CUDA cores' FMAs would bound it
CHUNK = 16  # e4m3 weights per 16-byte load
PLAIN = 0  # the input forms: bf16_gemv's INPUT_SWIGLU / INPUT_SIGMOID_GATE, or plain x
FORMS = (PLAIN, bf16_launch.INPUT_SWIGLU, bf16_launch.INPUT_SIGMOID_GATE)
# U (steps of loads in flight) by (x rows, input form): 2 wherever the .cu's launch bounds (64
# registers for one row plain or SwiGLU, else 80) hold it without spilling, else 1 (nvcc -Xptxas
# -v, sm_90: two plain rows spill 40 bytes at U = 2, none at U = 1; two SwiGLU rows spill 12 at
# U = 1 and none at U = 2)
UNROLL = {(1, f): 2 for f in FORMS} | {(2, PLAIN): 1, (2, FORMS[1]): 2, (2, FORMS[2]): 2}


def problem(
    x: torch.Tensor,
    weight: Fp8Weight,
    *,
    swiglu_input: bool = False,
    gate: torch.Tensor | None = None,
) -> str | None:
    """Why the kernel cannot take these operands, or None when it can (device checks last).
    `swiglu_input`: x is [M, 2K], gate then up; `gate`: x's [M, H, D] sigmoid gate."""
    if swiglu_input and gate is not None:
        return "one input form at a time"
    if gate is not None and x.dim() == 2:
        why = bf16_launch.gate_problem(x, gate)
        if why is not None:
            return why
    w, s = weight.weight, weight.scale_inv
    if x.dim() != 2 or w.dim() != 2:
        return f"x and weight must be 2-D, got {tuple(x.shape)} and {tuple(w.shape)}"
    if x.dtype != torch.bfloat16 or w.dtype != torch.float8_e4m3fn:
        return f"x must be bfloat16 and the weight e4m3, got {x.dtype} and {w.dtype}"
    n, k = w.shape
    if not 1 <= x.shape[0] <= MAX_ROWS:
        return f"x has {x.shape[0]} rows; the kernel takes 1..{MAX_ROWS}"
    if x.shape[1] != (2 * k if swiglu_input else k) or n < 1 or k < CHUNK or k % CHUNK:
        what = "a [gate | up] x" if swiglu_input else "x"
        return (
            f"{what} {tuple(x.shape)} against weight {tuple(w.shape)}: K must match and be a "
            f"positive multiple of {CHUNK}"
        )
    if s.dtype != torch.float32 or not s.is_contiguous():
        return "the block scales must be contiguous float32"
    if tuple(s.shape) != (-(-n // BLOCK), -(-k // BLOCK)):
        return f"scales {tuple(s.shape)} do not match weight {tuple(w.shape)}"
    if x.stride(1) != 1 or x.data_ptr() % 16 or (x.stride(0) * x.element_size()) % 16:
        return "x rows must be dense and 16-byte aligned"
    if not w.is_contiguous() or w.data_ptr() % 16:
        return "weight must be contiguous and 16-byte aligned"
    if x.device != w.device or x.device.type != "cuda" or s.device != w.device:
        return f"operands must share one CUDA device, got {x.device} and {w.device}"
    if torch.cuda.get_device_capability(x.device) < (8, 0):
        return "the kernel needs an sm_80+ GPU"
    return None


def supports(
    x: torch.Tensor,
    weight: Fp8Weight,
    *,
    swiglu_input: bool = False,
    gate: torch.Tensor | None = None,
) -> bool:
    """Whether the kernel takes these operands (otherwise the tensor-core kernel runs)."""
    return problem(x, weight, swiglu_input=swiglu_input, gate=gate) is None


def fp8_linear(
    x: torch.Tensor,
    weight: Fp8Weight,
    *,
    swiglu_input: bool = False,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """See `fp8_gemv.reference.fp8_linear`: [M, N] bf16. With `swiglu_input` x is a gate-up row
    and the product is swiglu(x) @ W.T (as `silu_mul` then this); with `gate` [M, H, D] it is
    (x * sigmoid(gate)) @ W.T (as `sigmoid_gate` then this)."""
    device = rt.check_cuda(x, weight.weight, weight.scale_inv)
    why = problem(x, weight, swiglu_input=swiglu_input, gate=gate)
    if why is not None:
        raise rt.KernelInputError(f"fp8 split GEMV: {why}")
    num_rows = x.shape[0]
    n, k = weight.shape
    out = torch.empty((num_rows, n), dtype=x.dtype, device=device)
    form = bf16_launch.INPUT_SWIGLU if swiglu_input else PLAIN
    if gate is not None:
        form = bf16_launch.INPUT_SIGMOID_GATE
    unroll = {num_rows: UNROLL[num_rows, form]}
    p = bf16_launch.plan(num_rows, n, k, rt.num_sms(device), chunk=CHUNK, unroll=unroll)
    instance = f"fp8_split_gemv<{num_rows}, {p.rows_per_group}, {p.unroll}, {form}>"
    kernel = rt.get_kernel(OP, instance, device, HEADERS)
    args = (
        rt.ptr(out),
        rt.ptr(x),
        rt.i64(x.stride(0)),
        rt.ptr(weight.weight),
        rt.ptr(weight.scale_inv),
        rt.i32(n),
        rt.i32(k),
        rt.i32(weight.scale_inv.shape[1]),
        rt.i32(p.ks_log2),
        rt.ptr(gate),
        rt.i64(gate.stride(0) if gate is not None else 0),
        rt.i64(gate.stride(1) if gate is not None else 0),
        rt.i32(gate.shape[2] if gate is not None else 0),
        rt.i32(bf16_launch.launch_options()),
    )
    rt.launch(kernel, (p.blocks,), (bf16_launch.THREADS,), args, device)
    return out
