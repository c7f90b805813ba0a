"""The split-K CUDA-core fp8 GEMV (`fp8_split_gemv`) against an fp64 product and the tensor-core
kernel (GPU only).

Fresh random weights, quantized on the GPU; x rows mix the hard cases of test_fp8_tc_gpu.py
(entries beyond f16's range, rows of 1e-30 and 1e30). The kernel widens each e4m3 weight exactly
and sums fp32 products, so each row is held to 1e-2 relative against the fp64 product of the
dequantized weights (bf16 output: ~2^-9 per element), and to the tensor-core kernel (the same
product, other summation order) within the same bound.
"""

from __future__ import annotations

import pytest
import torch
from tests.support.gpu_checks import FP8_SHAPES, capture_graph, fp8_hard_rows, fp8_weight

from ninfer.kernels import dispatch
from ninfer.kernels import runtime as rt
from ninfer.kernels.fp8_gemv import launch_tc as tc_cuda
from ninfer.kernels.fp8_gemv import reference as fp8_ref
from ninfer.kernels.fp8_split_gemv import launch as split_cuda

pytestmark = pytest.mark.gpu
TOL = 1e-2
SHAPES = FP8_SHAPES


def _rows_close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert torch.isfinite(got).all(), f"non-finite values ({what})"
    for r in range(got.shape[0]):
        err = ((got[r].double() - want[r].double()).norm() / want[r].double().norm()).item()
        assert err < TOL, f"x row {r}: relative error {err:.2e} against the {what}"


@pytest.mark.parametrize("rows", range(1, split_cuda.MAX_ROWS + 1))
@pytest.mark.parametrize("n,k", SHAPES)
def test_split_gemv_matches_fp64_and_the_tc_kernel(rows: int, n: int, k: int, gen) -> None:
    weight = fp8_weight(n, k)
    x = fp8_hard_rows(rows, k, gen)
    assert split_cuda.supports(x, weight)
    got = split_cuda.fp8_linear(x, weight)
    assert got.shape == (rows, n) and got.dtype == torch.bfloat16
    exact = x.double() @ fp8_ref.dequantize(weight.weight, weight.scale_inv, torch.float64).T
    _rows_close(got, exact, "fp64 product")
    if n >= 128:
        _rows_close(got, tc_cuda.fp8_linear(x, weight), "tensor-core kernel")


@pytest.mark.parametrize("rows", [1, 2])
def test_early_loads_give_the_same_bits_and_the_result_is_deterministic(
    rows: int, gen, monkeypatch
) -> None:
    weight = fp8_weight(5120, 17408)
    x = fp8_hard_rows(rows, 17408, gen)
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    first = split_cuda.fp8_linear(x, weight)
    assert torch.equal(first, split_cuda.fp8_linear(x, weight))
    monkeypatch.setenv("NINFER_KERNELS_OFF", "gemv_early_loads")
    assert torch.equal(split_cuda.fp8_linear(x, weight), first)


def test_row_views_of_a_merged_weight(gen) -> None:
    fused = fp8_weight(34816, 5120)
    x = fp8_hard_rows(1, 5120, gen)
    whole = split_cuda.fp8_linear(x, fused)
    part = fused.rows(17408, 34816)  # the up half: its own scale rows
    assert torch.equal(split_cuda.fp8_linear(x, part), whole[:, 17408:])


def test_replays_in_a_cuda_graph(gen) -> None:
    weight = fp8_weight(5120, 6144)
    x = fp8_hard_rows(1, 6144, gen)
    graph, out = capture_graph(lambda: split_cuda.fp8_linear(x, weight))
    x.copy_(fp8_hard_rows(1, 6144, gen))  # new inputs, same buffer
    graph.replay()
    torch.cuda.synchronize()
    exact = x.double() @ fp8_ref.dequantize(weight.weight, weight.scale_inv, torch.float64).T
    _rows_close(out, exact, "fp64 product after replay")


def test_dispatch_runs_it_only_when_switched_on(gen, monkeypatch) -> None:
    weight = fp8_weight(5120, 6144)
    x = fp8_hard_rows(1, 6144, gen)
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    assert torch.equal(dispatch.linear(x, weight), tc_cuda.fp8_linear(x, weight))
    monkeypatch.setenv("NINFER_KERNELS_ON", "fp8_split")
    assert torch.equal(dispatch.linear(x, weight), split_cuda.fp8_linear(x, weight))
    three = fp8_hard_rows(3, 6144, gen)  # past MAX_ROWS: the tensor-core kernel
    assert torch.equal(dispatch.linear(three, weight), tc_cuda.fp8_linear(three, weight))


def test_rejects_what_it_does_not_take(gen) -> None:
    weight = fp8_weight(48, 64)
    assert not split_cuda.supports(fp8_hard_rows(3, 64, gen), weight)
    assert not split_cuda.supports(fp8_hard_rows(1, 64, gen).float(), weight)
    with pytest.raises(rt.KernelInputError, match="fp8 split GEMV: x has 3 rows"):
        split_cuda.fp8_linear(fp8_hard_rows(3, 64, gen), weight)


@pytest.mark.parametrize("rows", [1, 2])
def test_swiglu_form_is_silu_mul_then_the_kernel_bit_for_bit(rows: int, gen, monkeypatch) -> None:
    """The down projection over a gate-up row: the same activated bits as `silu_mul` (the shared
    swiglu_bf16x2), the same sums; dispatch takes it only when switched on."""
    weight = fp8_weight(5120, 17408)
    gate_up = torch.randn(rows, 2 * 17408, device="cuda", generator=gen).to(torch.bfloat16)
    activated = dispatch.silu_mul(gate_up)
    fused = split_cuda.fp8_linear(gate_up, weight, swiglu_input=True)
    assert torch.equal(fused, split_cuda.fp8_linear(activated, weight))
    monkeypatch.setenv("NINFER_KERNELS_ON", "fp8_split")
    assert torch.equal(dispatch.swiglu_linear(gate_up, weight), fused)
    monkeypatch.delenv("NINFER_KERNELS_ON")
    assert torch.equal(dispatch.swiglu_linear(gate_up, weight), dispatch.linear(activated, weight))


@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("n,heads,head_dim", [(5120, 24, 256), (1003, 5, 112)])
def test_sigmoid_gate_form_matches_the_gate_kernel_then_the_gemv(
    rows: int, n: int, heads: int, head_dim: int, gen, monkeypatch
) -> None:
    """x = o * sigmoid(gate), the gate a strided view of a [M, H, 2, D] projection as the model
    slices it: against `sigmoid_gate` then the plain kernel (1e-3: the gate's exp may round a
    gated input to its neighbouring bf16) and against the fp64 product of the eager torch ops."""
    weight = fp8_weight(n, heads * head_dim)
    o = torch.randn(rows, heads, head_dim, device="cuda", generator=gen).to(torch.bfloat16)
    qg = torch.randn(rows, heads, 2, head_dim, device="cuda", generator=gen) * 3
    gate = qg.to(torch.bfloat16)[:, :, 1]
    got = split_cuda.fp8_linear(o.reshape(rows, -1), weight, gate=gate)
    gated = dispatch.sigmoid_gate(o, gate)
    want = split_cuda.fp8_linear(gated.contiguous(), weight)
    err = ((got.double() - want.double()).norm() / want.double().norm()).item()
    assert err < 1e-3
    eager = (o * torch.sigmoid(gate)).reshape(rows, -1)
    exact = eager.double() @ fp8_ref.dequantize(weight.weight, weight.scale_inv, torch.float64).T
    _rows_close(got, exact, "fp64 product of the eager gate")
    monkeypatch.setenv("NINFER_KERNELS_ON", "fp8_split")
    assert torch.equal(dispatch.sigmoid_gate_linear(o, gate, weight), got)


def test_input_forms_are_checked(gen) -> None:
    weight = fp8_weight(48, 64)
    x = fp8_hard_rows(1, 64, gen)
    assert "[gate | up]" in split_cuda.problem(x, weight, swiglu_input=True)  # needs 2K wide
    gate = torch.randn(1, 2, 32, device="cuda").to(torch.bfloat16)
    assert split_cuda.problem(x, weight, gate=gate) is None
    assert "one input form" in split_cuda.problem(x, weight, swiglu_input=True, gate=gate)
    assert "does not match" in split_cuda.problem(x, weight, gate=gate[:, :1])
