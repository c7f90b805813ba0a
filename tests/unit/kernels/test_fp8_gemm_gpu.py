"""The fp8 prefill GEMM on the GPU: quantize and dequantize kernels, blockwise `_scaled_mm`.

Kernels against their torch twins run on the same GPU: the quantizer's e4m3 bytes and scales and
the dequantizer's output must be bit-identical; the GEMM within 1e-2 relative (norm of the
difference over the norm of the reference) of the twin (x quantized the same way, fp32 product)
and within `ACT_QUANT_REL_ERROR` of the product with the unquantized x. Shapes: the 27B's
projections at 512 and 2,048 rows, and odd ones (padded rows, N and K off the grid, strided x).
"""

from __future__ import annotations

import pytest
import torch

from ninfer.artifact.quantize import quantize_fp8_block
from ninfer.kernels import dispatch
from ninfer.kernels import runtime as rt
from ninfer.kernels.fp8_gemm import launch
from ninfer.kernels.fp8_gemm import reference as ref
from ninfer.kernels.fp8_gemm.launch import GemmPath
from ninfer.kernels.fp8_gemv import reference as gemv_ref
from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from support.gpu_checks import rel

pytestmark = pytest.mark.gpu

# 27B projections, N x K: MLP gate+up fused, MLP down, DeltaNet in_proj qkv+z+b+a fused (N off the
# 128 grid), attention o_proj / DeltaNet out_proj, attention q(+gate)+k+v fused
SHAPES_27B = [(34816, 5120), (5120, 17408), (16480, 5120), (5120, 6144), (14336, 5120)]


def _weight(n: int, k: int, gen: torch.Generator) -> Fp8Weight:
    w = torch.randn(n, k, device="cuda", generator=gen) * k**-0.5
    w *= torch.rand(n, 1, device="cuda", generator=gen) * 4  # rows of different magnitude
    return Fp8Weight(*quantize_fp8_block(w))


def _x(m: int, k: int, gen: torch.Generator, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    x = torch.randn(m, k, device="cuda", generator=gen)
    x *= torch.exp(torch.randn(1, k, device="cuda", generator=gen))  # outlier-ish channels
    return x.to(dtype)


def _support() -> launch.BlockwiseSupport:
    support = launch.blockwise_support(torch.device("cuda"))
    assert support is not None  # not inside a graph capture
    return support


def _need_blockwise(n: int) -> None:
    support = _support()
    if not support.on_grid or (n % 128 and not support.off_grid_n):
        pytest.skip(f"blockwise _scaled_mm not available here: {support.reason}")


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator("cuda").manual_seed(4321)


def test_blockwise_scaled_mm_works_on_hopper() -> None:
    """On an H100/H200 (torch 2.11, CUDA 13) the probe must find the fp8 GEMM, N off-grid too."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("cuBLAS's 1x128 / 128x128 block scaling is an sm_90 feature")
    support = _support()
    assert support.on_grid and support.off_grid_n, support.reason


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("row_multiple", [1, 4])
@pytest.mark.parametrize(
    "m,k", [(512, 5120), (2048, 17408), (7, 300), (1, 128), (33, 6144), (5, 1000), (3, 2)]
)
def test_quantize_kernel_is_bit_identical_to_twin(dtype, row_multiple, m, k, gen) -> None:
    x = _x(m, k, gen, dtype)
    if k >= 256:
        x[0, 128:256] = 0.0  # a zero group
    got = launch.quantize_activations(x, row_multiple=row_multiple)
    want = ref.quantize_activations(x, row_multiple=row_multiple)
    assert got.values.shape == want.values.shape and got.scales.shape == want.scales.shape
    assert torch.equal(got.values.view(torch.uint8), want.values.view(torch.uint8))
    assert torch.equal(got.scales, want.scales)
    assert got.scales.stride(0) == 1 and got.scales.stride(1) == got.scales.shape[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_quantize_kernel_reads_strided_and_unaligned_rows(dtype, gen) -> None:
    wide = _x(40, 1600, gen, dtype)
    for x in (wide[:, 256:1280], wide[:, 1:1025], wide[::3, 64:576]):  # vector, scalar, strided
        got = launch.quantize_activations(x, row_multiple=4)
        want = ref.quantize_activations(x.contiguous(), row_multiple=4)
        assert torch.equal(got.values.view(torch.uint8), want.values.view(torch.uint8))
        assert torch.equal(got.scales, want.scales)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("n,k", [*SHAPES_27B, (1000, 272), (200, 300), (48, 64), (3, 5)])
def test_dequantize_kernel_is_bit_identical_to_twin(dtype, n: int, k: int, gen) -> None:
    w = _weight(n, k, gen)
    got = launch.dequantize(w, dtype)
    assert got.dtype == dtype and got.shape == (n, k)
    assert torch.equal(got, ref.dequantize_weight(w, dtype))
    if n > 256:
        part = w.rows(256, n)  # a row view of a fused weight: its own scale rows
        assert torch.equal(launch.dequantize(part, dtype), got[256:])


@pytest.mark.parametrize("m", [512, 2048])
@pytest.mark.parametrize("n,k", SHAPES_27B)
def test_fp8_gemm_matches_twin_at_27b_shapes(m: int, n: int, k: int, gen) -> None:
    _need_blockwise(n)
    w, x = _weight(n, k, gen), _x(m, k, gen)
    got = launch.fp8_gemm(x, w)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    assert rel(got, ref.fp8_gemm(x, w)) < 1e-2
    exact = x.double() @ ref.dequantize_weight(w, torch.float64).T
    assert rel(got, exact) < ref.ACT_QUANT_REL_ERROR


@pytest.mark.parametrize("m", [1, 9, 13, 130])
@pytest.mark.parametrize("n,k", [(272, 512), (16, 1024), (640, 2048), (4096, 1536)])
def test_fp8_gemm_matches_twin_at_odd_shapes(m: int, n: int, k: int, gen) -> None:
    _need_blockwise(n)
    w, x = _weight(n, k, gen), _x(m, k, gen)
    got = launch.fp8_gemm(x, w)
    assert got.shape == (m, n)
    assert rel(got, ref.fp8_gemm(x, w)) < 1e-2


def test_fp8_gemm_refuses_operands_off_its_grid(gen) -> None:
    x = _x(32, 300, gen)
    with pytest.raises(rt.KernelInputError, match="K % 512"):
        launch.fp8_gemm(x, _weight(256, 300, gen))
    with pytest.raises(rt.KernelInputError, match="bf16"):
        launch.fp8_gemm(_x(32, 512, gen, torch.float32), _weight(256, 512, gen))


@pytest.mark.parametrize(
    "dtype,n,k",
    [(torch.float32, 640, 512), (torch.bfloat16, 640, 300), (torch.bfloat16, 200, 512)],
    ids=["fp32-x", "k-off-grid", "n-not-16"],
)
def test_fallback_is_dequantize_then_cublas(dtype, n: int, k: int, gen) -> None:
    w, x = _weight(n, k, gen), _x(3 * 40, k, gen, dtype).reshape(3, 40, k)
    assert launch.choose_path(x.reshape(-1, k), w) is GemmPath.DEQUANTIZE
    got = launch.fp8_linear(x, w)
    assert got.shape == (3, 40, n) and got.dtype == dtype
    want = ref.fp8_linear(x.reshape(-1, k), w).reshape(3, 40, n)
    assert torch.equal(got, want)  # same scratch bits, same cuBLAS call


def test_dispatch_runs_the_fp8_gemm_for_prefill(gen, monkeypatch) -> None:
    n, k = 5120, 6144
    w, x = _weight(n, k, gen), _x(600, k, gen)
    support = _support()
    path = launch.choose_path(x, w)
    assert path is (GemmPath.SCALED_MM if support.on_grid else GemmPath.DEQUANTIZE)
    got = dispatch.linear(x, w)
    assert got.shape == (600, n) and got.dtype == torch.bfloat16
    if path is GemmPath.SCALED_MM:
        assert rel(got, ref.fp8_gemm(x, w)) < 1e-2
    exact = x.double() @ ref.dequantize_weight(w, torch.float64).T
    assert rel(got, exact) < ref.ACT_QUANT_REL_ERROR
    # a 3-D x takes the same path; switched off, the GEMV's dequantize twin runs unchanged
    assert torch.equal(dispatch.linear(x.reshape(2, 300, k), w).reshape(600, n), got)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "fp8_gemm")
    assert torch.equal(dispatch.linear(x, w), gemv_ref.fp8_linear(x, w))


def _capture(w: Fp8Weight, static_x: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = launch.fp8_linear(static_x, w)
    return graph, out


def test_fp8_linear_replays_in_a_cuda_graph(gen, monkeypatch) -> None:
    """Decode batches past the GEMV's rows are captured: no sync or data-dependent allocation."""
    w, x = _weight(1024, 2048, gen), _x(16, 2048, gen)
    eager = launch.fp8_linear(x, w)  # probes (once) and compiles before any capture
    launch.dequantize(w, torch.bfloat16)  # the fallback's kernel too
    static_x = torch.zeros_like(x)
    graph, out = _capture(w, static_x)
    static_x.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    assert rel(out, eager) < 1e-2
    # a capture that meets no probe result cannot probe (it syncs): it takes the dequantize path
    monkeypatch.setattr(launch, "_support", {})
    static_x.zero_()
    graph, out = _capture(w, static_x)
    assert launch._support == {}
    static_x.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    assert rel(out, ref.fp8_linear(x, w)) < 1e-2


@pytest.mark.parametrize("m", [1, 3, 8])
def test_opt_in_w8a8_takes_decode_rows_off_the_gemv(m: int, gen, monkeypatch) -> None:
    """`NINFER_KERNELS_ON=fp8_w8a8` sends decode-sized x to the W8A8 GEMM (x rounded to e4m3:
    the twin's sums, not the weight-only GEMV's); without it the GEMV runs, with other bits."""
    n, k = 5120, 6144
    w, x = _weight(n, k, gen), _x(m, k, gen)
    _need_blockwise(n)
    gemv = dispatch.linear(x, w)
    monkeypatch.setenv("NINFER_KERNELS_ON", "fp8_w8a8")
    got = dispatch.linear(x, w)
    assert got.shape == (m, n) and got.dtype == torch.bfloat16
    assert torch.equal(got, launch.fp8_gemm(x, w))
    assert rel(got, ref.fp8_gemm(x, w)) < 1e-2
    exact = x.double() @ ref.dequantize_weight(w, torch.float64).T
    assert rel(got, exact) < ref.ACT_QUANT_REL_ERROR
    assert rel(gemv, exact) < 1e-2 and not torch.equal(got, gemv)  # the route really changed
    # captured: the probe is cached, so the graph holds the W8A8 GEMM, and replays it
    static_x = x.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dispatch.linear(static_x, w)
    fresh = _x(m, k, gen)
    static_x.copy_(fresh)
    graph.replay()
    assert torch.equal(out, launch.fp8_gemm(fresh, w))
