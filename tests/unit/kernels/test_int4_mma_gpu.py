"""The tensor-core int4 kernel (`int4_mma`) against its torch twin (GPU only).

bf16 x, 1..64 rows per launch. Tolerance TOL = 1e-5 relative (norm of the difference over the
norm of the twin's result), as for the CUDA-core kernel: q and bf16 x are exact in bf16, their
products exact, each 64-wide group is summed by the tensor cores' fp32 accumulation (not IEEE
round-to-nearest at every add, hence "to fp32 rounding" rather than bit equality), multiplied by
its scale and the groups summed in fp32. TF32 stays off for the twin's matmul.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch
from ninfer.kernels.int4_gemv import launch as int4_cuda
from ninfer.kernels.int4_gemv import reference as int4_ref
from ninfer.model import lm_head_draft
from ninfer.model.lm_head_draft import ShortlistHead
from support.gpu_checks import capture_graph, int4_operands, rel

pytestmark = pytest.mark.gpu
TOL = 1e-5
ROWS = [1, 4, 8, 9, 16, 64]


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved


def _x(m: int, hidden: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(m, hidden, device="cuda", generator=gen).to(torch.bfloat16)


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize(
    "hidden,num_out", [(5120, 131072), (2048, 131072), (5120, 1001), (2048, 37)]
)
def test_int4_mma_matches_twin(m: int, hidden: int, num_out: int, gen) -> None:
    """27B (H 5120) and 35B (H 2048) shortlists, and small odd R (not a multiple of 16 or 128)."""
    packed, scale = int4_operands(num_out, hidden, gen)
    x = _x(m, hidden, gen)
    assert int4_cuda.uses_mma(x) and int4_cuda.supports(x, packed, scale)
    got = int4_cuda.int4_linear(x, packed, scale)
    assert got.shape == (m, num_out) and got.dtype == torch.float32
    assert rel(got, int4_ref.int4_linear(x, packed, scale)) < TOL
    if m <= int4_cuda.MAX_ROWS:  # the CUDA-core kernel agrees too
        core = int4_cuda.int4_linear(x, packed, scale, tensor_cores=False)
        assert rel(got, core) < TOL


def test_int4_mma_strided_rows_and_dispatch_chunks(gen, monkeypatch) -> None:
    monkeypatch.setattr(int4_cuda, "MMA_ROUTED", True)  # as once measured: dispatch takes it
    packed, scale = int4_operands(777, 2048, gen)
    wide = _x(3, 2048 + 64, gen)
    x = wide[:, 64:]  # row stride 2112 elements (16-byte multiple), not contiguous as a whole
    assert (
        rel(int4_cuda.int4_linear(x, packed, scale), int4_ref.int4_linear(x, packed, scale)) < TOL
    )
    many = _x(150, 2048, gen)  # dispatch: launches of 64, 64, 22 rows
    assert (
        rel(dispatch.int4_linear(many, packed, scale), int4_ref.int4_linear(many, packed, scale))
        < TOL
    )


def test_switch_off_runs_the_cuda_core_kernel(gen, monkeypatch) -> None:
    packed, scale = int4_operands(500, 2048, gen)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "int4_mma")
    x8, x9 = _x(8, 2048, gen), _x(9, 2048, gen)
    assert dispatch.int4_linear_available(x8, packed, scale)
    assert not dispatch.int4_linear_available(x9, packed, scale)  # 9 rows: the twin
    assert not dispatch.int4_mma_available(x8, packed, scale)
    calls: list[bool] = []
    real = int4_cuda.int4_linear

    def recording(x, packed, scale, tensor_cores=True):
        calls.append(tensor_cores)
        return real(x, packed, scale, tensor_cores=tensor_cores)

    monkeypatch.setattr(int4_cuda, "int4_linear", recording)
    assert (
        rel(dispatch.int4_linear(x8, packed, scale), int4_ref.int4_linear(x8, packed, scale)) < TOL
    )
    assert calls == [False]


def test_dispatch_keeps_the_cuda_core_kernel_until_routed(gen, monkeypatch) -> None:
    """MMA_ROUTED False (the default until measured): dispatch runs the CUDA-core kernel for
    1..8 rows and the twin above, exactly as before the tensor-core kernel existed."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    monkeypatch.setattr(int4_cuda, "MMA_ROUTED", False)
    packed, scale = int4_operands(500, 2048, gen)
    x8, x9 = _x(8, 2048, gen), _x(9, 2048, gen)
    assert dispatch.int4_linear_available(x8, packed, scale)
    assert not dispatch.int4_linear_available(x9, packed, scale)
    assert not dispatch.int4_mma_available(x8, packed, scale)
    want = int4_cuda.int4_linear(x8, packed, scale, tensor_cores=False)
    assert torch.equal(dispatch.int4_linear(x8, packed, scale), want)


def test_int4_mma_is_recorded_by_a_cuda_graph(gen) -> None:
    packed, scale = int4_operands(1000, 2048, gen)
    x = _x(16, 2048, gen)
    graph, out = capture_graph(lambda: int4_cuda.int4_linear(x, packed, scale))
    x.copy_(_x(16, 2048, gen))
    graph.replay()
    torch.cuda.synchronize()
    assert rel(out, int4_ref.int4_linear(x, packed, scale)) < TOL


def test_shortlist_head_serving_every_row_count(gen, monkeypatch) -> None:
    """MMA_SERVES_ALL_ROWS as the integrator would set it: no bf16 copy, the kernel for all."""
    monkeypatch.setattr(lm_head_draft, "MMA_SERVES_ALL_ROWS", True)
    monkeypatch.setattr(int4_cuda, "MMA_ROUTED", True)
    lm_head = (torch.randn(3000, 1024, device="cuda", generator=gen) * 0.05).to(torch.bfloat16)
    head = ShortlistHead(lm_head, num_sampleable=2900, size=2048)
    assert head.fused and head.all_rows and head.weight is None
    for rows in (1, 5, 64, 100):
        hidden = _x(rows, 1024, gen)
        ids = head.propose(hidden)
        twin = int4_ref.int4_linear(hidden, head.packed, head.scale)
        chosen = twin.gather(1, ids[:, None])[:, 0]
        slack = 1e-5 * twin.abs().amax(-1)  # a near-tie may go either way
        assert (twin.max(-1).values - chosen <= slack).all()
