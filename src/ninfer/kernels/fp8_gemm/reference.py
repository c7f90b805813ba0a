"""Torch twins of the fp8 prefill GEMM: 1x128 activation quantisation, block dequantisation, GEMM.

Imports only torch and the `Fp8Weight` format. The GEMM twin quantizes x exactly as the CUDA
kernel does, dequantizes both operands and multiplies in fp32, so kernel vs twin differs only by
accumulation order; what the activation quantisation itself costs (against the unquantized-x
product) is a separate, stated bound (`ACT_QUANT_REL_ERROR`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ninfer.kernels.fp8_gemv.reference import BLOCK, Fp8Weight

E4M3_MAX = 448.0
# Round-to-nearest e4m3 keeps 3 mantissa bits: an element's error is at most 2^-4 of its value
# (normal range), and for mantissas spread over a binade its RMS is 2^-3 / sqrt(24) ~= 0.026.
# Independent errors add in quadrature, so ||x_q W^T - x W^T|| / ||x W^T|| is about that RMS for
# dense random data; 0.04 leaves room for unlucky groups and the e4m3 subnormals.
ACT_QUANT_REL_ERROR = 0.04


class Fp8Activations(NamedTuple):
    """x quantized per row and 128-column group, in the layout `torch._scaled_mm` takes."""

    values: torch.Tensor  # [M_pad, K] float8_e4m3fn (rows past M are zero)
    scales: torch.Tensor  # [M_pad, ceil(K/128)] float32, strides (1, M_pad): outer-dim-major


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def quantize_activations(x: torch.Tensor, row_multiple: int = 1) -> Fp8Activations:
    """e4m3 values and fp32 scales (amax / 448, 1 for an all-zero group) per 1x128 group of x.

    Args:
        x: [M, K] bf16 or fp32.
        row_multiple: pad the rows to a multiple of this (zero rows with scale 1), so that the
            scale tensor's leading dimension keeps cuBLAS's 16-byte alignment.
    Returns:
        `Fp8Activations`; values * scales (per group) reproduces x to e4m3 precision.
    """
    m, k = x.shape
    num_groups = -(-k // BLOCK)
    m_pad = _round_up(m, row_multiple)
    padded = torch.zeros((m_pad, num_groups * BLOCK), dtype=torch.float32, device=x.device)
    padded[:m, :k] = x.float()
    groups = padded.view(m_pad, num_groups, BLOCK)  # [M_pad, K_pad] -> [M_pad, groups, 128]
    amax = groups.abs().amax(dim=-1)
    # a tensor divisor, not a Python number: CUDA torch turns division by a scalar into a product
    # with its reciprocal (1 ulp off), the kernel divides correctly rounded
    scales = amax / torch.full_like(amax, E4M3_MAX)
    scales = torch.where(amax > 0, scales, torch.ones_like(amax))
    q = (groups / scales[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    values = q.view(m_pad, num_groups * BLOCK)[:, :k].contiguous()
    return Fp8Activations(values, scales.t().contiguous().t())


def dequantize_activations(act: Fp8Activations, num_rows: int | None = None) -> torch.Tensor:
    """fp32 [num_rows, K]: every e4m3 value times its group's scale (exact in fp32)."""
    rows = act.values.shape[0] if num_rows is None else num_rows
    full = act.scales[:rows].repeat_interleave(BLOCK, dim=1)[:, : act.values.shape[1]]
    return act.values[:rows].float() * full


def dequantize_weight(weight: Fp8Weight, dtype: torch.dtype) -> torch.Tensor:
    """[N, K] in `dtype`: e4m3 times its 128x128 block scale in fp32, rounded once.

    Same values, bit for bit, as `fp8_gemv.reference.dequantize` (what the CUDA dequantize kernel
    is checked against); written out here so this op does not lean on the GEMV's internals.
    """
    n, k = weight.shape
    full = weight.scale_inv.float().repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return (weight.weight.float() * full[:n, :k]).to(dtype)


def fp8_gemm(x: torch.Tensor, weight: Fp8Weight) -> torch.Tensor:
    """x @ W^T with x quantized per 1x128 group as the kernel does, multiplied in fp32.

    Args:
        x: [M, K] bf16 or fp32; weight: [N, K] e4m3 with [ceil(N/128), ceil(K/128)] scales.
    Returns:
        [M, N] in x's dtype.
    """
    x_deq = dequantize_activations(quantize_activations(x), x.shape[0])
    return F.linear(x_deq, dequantize_weight(weight, torch.float32)).to(x.dtype)


def fp8_linear(x: torch.Tensor, weight: Fp8Weight) -> torch.Tensor:
    """The dequantize fallback: x (unquantized) @ dequantize(W)^T in x's dtype, any leading dims."""
    return F.linear(x, dequantize_weight(weight, x.dtype))
