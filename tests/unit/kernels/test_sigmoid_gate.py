"""The sigmoid-gate kernel's twin, operand checks, and CPU dispatch (CPU)."""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch, runtime
from ninfer.kernels.sigmoid_gate import launch as gate_cuda
from ninfer.kernels.sigmoid_gate import reference as gate_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_twin_and_cpu_dispatch_are_the_eager_ops(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(torch.seed() % 2**31)
    o = torch.randn(5, 3, 16, generator=g).to(dtype).transpose(0, 1).contiguous().transpose(0, 1)
    qg = torch.randn(5, 3, 2, 16, generator=g).to(dtype)
    want = (o * torch.sigmoid(qg[:, :, 1])).reshape(5, -1)
    assert torch.equal(gate_ref.sigmoid_gate(o, qg[:, :, 1]), want)
    assert torch.equal(dispatch.sigmoid_gate(o, qg[:, :, 1]), want)


def test_problem_names_what_is_wrong() -> None:
    bf16 = torch.bfloat16
    o = torch.randn(2, 4, 16).to(bf16)
    gate = torch.randn(2, 4, 2, 16).to(bf16)[:, :, 1]
    assert "CUDA" in gate_cuda.problem(o, gate)  # well-formed, but on the CPU
    assert "[T, H, D]" in gate_cuda.problem(o.reshape(2, -1), gate)
    assert "[T, H, D]" in gate_cuda.problem(o, gate[:1])
    assert "bfloat16" in gate_cuda.problem(o.float(), gate)
    assert not gate_cuda.supports(o, gate)
    with pytest.raises(runtime.KernelInputError, match="CUDA device"):
        gate_cuda.sigmoid_gate(o, gate)
