"""The int4 GEMV kernel against its torch twin, and the shortlist head that calls it (GPU only).

Fresh random packed nibbles and scales per test (the conftest `gen`). Tolerance 1e-5 relative
(norm of the difference over the norm of the twin's result) for fp32 and bf16 x alike: both sides
convert x to fp32 exactly (bf16 is a truncated fp32) and multiply exact small integers q by it in
fp32, so they differ only in the summation order of fp32 sums over H. TF32 stays off for the
twin's matmul. Proposals are compared by the twin's logits of the chosen ids, not by ids, since
near-ties may flip with the summation order.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch, runtime
from ninfer.kernels.int4_gemv import launch as int4_cuda
from ninfer.kernels.int4_gemv import reference as int4_ref
from ninfer.model import lm_head_draft
from ninfer.model.lm_head_draft import FUSED_MAX_ROWS, ShortlistHead
from support.gpu_checks import capture_graph, int4_operands, rel

pytestmark = pytest.mark.gpu
TOL = 1e-5
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("hidden", [64, 2048, 5120])
def test_int4_gemv_matches_twin(dtype, rows: int, hidden: int, gen) -> None:
    packed, scale = int4_operands(1000, hidden, gen)
    x = torch.randn(rows, hidden, device="cuda", generator=gen).to(dtype)
    assert int4_cuda.supports(x, packed, scale)
    got = int4_cuda.int4_linear(x, packed, scale)
    assert got.shape == (rows, 1000) and got.dtype == torch.float32
    assert rel(got, int4_ref.int4_linear(x, packed, scale)) < TOL
    exact = x.double() @ int4_ref.dequantize(packed, scale).double().T
    assert rel(got, exact) < TOL


@pytest.mark.parametrize(
    "dtype,rows", [(torch.bfloat16, 1), (torch.float32, 8)], ids=["bf16-1", "fp32-8"]
)
def test_int4_gemv_shortlist_shape(dtype, rows: int, gen) -> None:
    """The 27B shortlist: 131,072 rows of H = 5120."""
    packed, scale = int4_operands(131072, 5120, gen)
    x = torch.randn(rows, 5120, device="cuda", generator=gen).to(dtype)
    got = int4_cuda.int4_linear(x, packed, scale)
    assert rel(got, int4_ref.int4_linear(x, packed, scale)) < TOL


@pytest.mark.parametrize("num_x", [1, 2, 8, 9, 64])
def test_mma_scales_through_l1_give_the_same_bits(num_x: int, gen, monkeypatch) -> None:
    """The default scale loads through L1 change their cache path, not their values:
    `NINFER_KERNELS_OFF=int4_mma_l1_scales` (L2 only) gives the same bits."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    packed, scale = int4_operands(1000, 5120, gen)
    x = torch.randn(num_x, 5120, device="cuda", generator=gen).to(torch.bfloat16)
    want = int4_cuda.int4_linear(x, packed, scale)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "int4_mma_l1_scales")
    assert torch.equal(int4_cuda.int4_linear(x, packed, scale), want)


def test_dispatch_sends_one_row_to_cuda_cores_and_two_to_the_tensor_cores(gen, monkeypatch):
    """One-row proposals keep the CUDA-core kernel (135 against 162 µs on the 27B shortlist, run
    S41A); from MMA_MIN_ROWS rows the tensor-core one."""
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    packed, scale = int4_operands(1000, 5120, gen)
    for num_x, tensor_cores in ((1, False), (int4_cuda.MMA_MIN_ROWS, True)):
        x = torch.randn(num_x, 5120, device="cuda", generator=gen).to(torch.bfloat16)
        want = int4_cuda.int4_linear(x, packed, scale, tensor_cores=tensor_cores)
        other = int4_cuda.int4_linear(x, packed, scale, tensor_cores=not tensor_cores)
        assert not torch.equal(want, other)  # the two kernels add in different orders
        assert torch.equal(dispatch.int4_linear(x, packed, scale), want)


def test_int4_gemv_rows_off_the_warp_tile(gen) -> None:
    """R not a multiple of the 16 rows a block covers: the tail rows are written, nothing past."""
    packed, scale = int4_operands(37, 128, gen)
    x = torch.randn(2, 128, device="cuda", generator=gen)
    got = int4_cuda.int4_linear(x, packed, scale)
    assert rel(got, int4_ref.int4_linear(x, packed, scale)) < TOL


def test_launcher_refusals(gen) -> None:
    packed, scale = int4_operands(64, 128, gen)
    odd = torch.zeros(64, 48, dtype=torch.uint8, device="cuda")  # H = 96
    with pytest.raises(runtime.KernelInputError, match="multiple of the scale group"):
        int4_cuda.int4_linear(torch.randn(1, 96, device="cuda"), odd, scale[:, :1])
    nine = torch.randn(9, 128, device="cuda", generator=gen)
    with pytest.raises(runtime.KernelInputError, match=r"1\.\.8"):
        int4_cuda.int4_linear(nine, packed, scale)
    with pytest.raises(runtime.KernelInputError, match="16-byte aligned"):
        int4_cuda.int4_linear(torch.randn(1, 130, device="cuda")[:, 2:], packed, scale)
    # dispatch: more rows than a launch takes run the twin; strided rows are made dense first
    assert (
        rel(dispatch.int4_linear(nine, packed, scale), int4_ref.int4_linear(nine, packed, scale))
        < 1e-6
    )
    wide = torch.randn(3, 256, device="cuda", generator=gen).to(torch.bfloat16)
    x = wide[:, 64:192]
    assert rel(dispatch.int4_linear(x, packed, scale), int4_ref.int4_linear(x, packed, scale)) < TOL


def test_int4_gemv_is_recorded_by_a_cuda_graph(gen) -> None:
    packed, scale = int4_operands(500, 256, gen)
    x = torch.randn(4, 256, device="cuda", generator=gen).to(torch.bfloat16)
    graph, out = capture_graph(lambda: int4_cuda.int4_linear(x, packed, scale))
    x.copy_(torch.randn(4, 256, device="cuda", generator=gen))
    graph.replay()
    torch.cuda.synchronize()
    assert rel(out, int4_ref.int4_linear(x, packed, scale)) < TOL


@pytest.mark.parametrize("dtype", DTYPES)
def test_shortlist_head_on_cuda_proposes_the_twins_argmax(dtype, gen, monkeypatch) -> None:
    """The head with its bf16 copy (MMA_SERVES_ALL_ROWS off; test_int4_mma_gpu.py has it on)."""
    monkeypatch.setattr(lm_head_draft, "MMA_SERVES_ALL_ROWS", False)
    lm_head = (torch.randn(3000, 1024, device="cuda", generator=gen) * 0.05).to(dtype)
    head = ShortlistHead(lm_head, num_sampleable=2900, size=2048)
    assert head.fused and head.weight is not None  # the copy serves proposals of many rows
    for rows in (1, 3, FUSED_MAX_ROWS, 8, 20, 64):
        hidden = torch.randn(rows, 1024, device="cuda", generator=gen).to(dtype)
        ids = head.propose(hidden)
        assert ids.shape == (rows,) and (ids < 2048).all()
        if rows > FUSED_MAX_ROWS:  # the dequantized rows through F.linear, exactly
            want = F.linear(hidden.to(head.weight.dtype), head.weight).float().argmax(-1)
            assert torch.equal(ids, want)
            continue
        twin = int4_ref.int4_linear(hidden, head.packed, head.scale)
        best = twin.max(-1).values
        chosen = twin.gather(1, ids[:, None])[:, 0]
        slack = 1e-5 * twin.abs().amax(-1)  # a near-tie may go either way
        assert (best - chosen <= slack).all()


def test_shortlist_head_keeps_the_dequantized_rows_without_the_kernel(gen, monkeypatch) -> None:
    monkeypatch.setenv("NINFER_KERNELS_OFF", "int4_gemv")
    lm_head = torch.randn(300, 128, device="cuda", generator=gen).to(torch.bfloat16)
    head = ShortlistHead(lm_head, num_sampleable=300, size=256)
    assert not head.fused and head.weight is not None and head.weight.dtype == torch.bfloat16
    assert (head.propose(torch.randn(5, 128, device="cuda").to(torch.bfloat16)) < 256).all()
