"""silu_mul and gated_rms_norm kernels against their torch twins, prefill and decode shapes (GPU).

Each kernel has a vector path (16-byte or per-lane chunk loads, chosen by `plan_launch` on aligned
inputs) and a scalar fallback; tests that mean one path assert the plan picks it, so a planner
change cannot leave a path silently untested. Tolerances (METHOD.md): bf16 outputs within 1e-2
relative, fp32 within 1e-4; silu_mul's two paths agree bit for bit (same rounding steps).
Speed is measured by `ninfer bench --profile` (docs/perf.md), not asserted here.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels.gated_rms_norm import launch as gated_cuda
from ninfer.kernels.gated_rms_norm import reference as gated_ref
from ninfer.kernels.silu_mul import launch as silu_cuda
from ninfer.kernels.silu_mul import reference as silu_ref
from support.gpu_checks import capture_graph, rel

pytestmark = pytest.mark.gpu
TOL = {torch.bfloat16: 1e-2, torch.float32: 1e-4}
DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")]
HEAD_DIM = 128  # DeltaNet value head dim, both models


def _misaligned(t: torch.Tensor) -> torch.Tensor:
    """The same values one element into a buffer a column wider: odd address and row stride."""
    buf = torch.empty(t.shape[0], t.shape[1] + 1, dtype=t.dtype, device=t.device)
    view = buf[:, 1:]
    view.copy_(t)
    return view


# -- silu_mul ----------------------------------------------------------------------------------


def _silu_kernel(x: torch.Tensor) -> str:
    return silu_cuda.plan_launch(
        x.shape[0], x.shape[1] // 2, x.stride(0), x.data_ptr(), x.element_size()
    ).kernel


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [2048, 8192], ids=["27b-2k", "27b-8k"])
def test_silu_mul_prefill_matches_the_twin_and_the_scalar_path(dtype, rows: int, gen) -> None:
    inter = 17408
    gate_up = torch.randn(rows, 2 * inter, device="cuda", generator=gen).mul_(3).to(dtype)
    assert _silu_kernel(gate_up) == "silu_mul_vec"
    got = silu_cuda.silu_mul(gate_up)
    want = silu_ref.silu_mul(gate_up)
    assert got.shape == (rows, inter) and got.dtype == dtype
    assert rel(got, want) < TOL[dtype]
    if dtype == torch.bfloat16:  # fast exp/divide vs torch's: rare one-ulp rounding flips only
        assert (got != want).float().mean().item() < 1e-2
    del want
    slow_input = _misaligned(gate_up)
    assert _silu_kernel(slow_input) == "silu_mul"
    assert torch.equal(got, silu_cuda.silu_mul(slow_input))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "rows,inter",
    [(1, 17408), (8, 17408), (1, 512), (8, 512), (5, 24), (3, 12), (3, 5), (7, 1), (70_000, 64)],
    ids=["27b-b1", "27b-b8", "35b-b1", "35b-b8", "3vec", "12", "odd", "one", "grid-y-loop"],
)
def test_silu_mul_decode_and_odd_shapes(dtype, rows: int, inter: int, gen) -> None:
    """Dense, a column slice of a wider GEMM output, and a slice one column in: all match the
    twin, and all equal the scalar path exactly."""
    wide = torch.randn(rows, 2 * inter + 16, device="cuda", generator=gen).mul_(3).to(dtype)
    dense = wide[:, : 2 * inter].contiguous()
    if inter % (16 // dense.element_size()) == 0:
        assert _silu_kernel(dense) == _silu_kernel(wide[:, : 2 * inter]) == "silu_mul_vec"
    for gate_up in (dense, wide[:, : 2 * inter], wide[:, 1 : 2 * inter + 1]):
        before = gate_up.clone()
        got = silu_cuda.silu_mul(gate_up)
        assert got.shape == (rows, inter)
        assert rel(got, silu_ref.silu_mul(gate_up)) < TOL[dtype]
        assert torch.equal(gate_up, before)  # the input is only read
        assert torch.equal(got, silu_cuda.silu_mul(_misaligned(gate_up)))


def test_silu_mul_takes_leading_dims(gen) -> None:
    gate_up = torch.randn(2, 3, 2 * 512, device="cuda", generator=gen).to(torch.bfloat16)
    got = silu_cuda.silu_mul(gate_up)
    assert got.shape == (2, 3, 512)
    assert rel(got, silu_ref.silu_mul(gate_up)) < 1e-2


def test_silu_mul_replays_in_a_cuda_graph(gen) -> None:
    gate_up = torch.randn(4, 2 * 17408, device="cuda", generator=gen).to(torch.bfloat16)
    graph, result = capture_graph(lambda: silu_cuda.silu_mul(gate_up))
    gate_up.copy_(torch.randn(gate_up.shape, device="cuda", generator=gen).to(torch.bfloat16))
    graph.replay()
    assert rel(result, silu_ref.silu_mul(gate_up)) < 1e-2


# -- gated_rms_norm ----------------------------------------------------------------------------


def _fused_z(tokens: int, num_k_heads: int, num_v_heads: int, gen) -> torch.Tensor:
    """z as the model reads it: [T, Hv, 128] in place inside the fused qkv|z|b|a projection."""
    conv_dim = 2 * num_k_heads * HEAD_DIM + num_v_heads * HEAD_DIM
    value_dim = num_v_heads * HEAD_DIM
    width = conv_dim + value_dim + 2 * num_v_heads
    proj = torch.randn(tokens, width, device="cuda", generator=gen).to(torch.bfloat16)
    return proj[:, conv_dim : conv_dim + value_dim].view(tokens, num_v_heads, HEAD_DIM)


def _shifted(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t that starts one element past an aligned address."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = buf[1:].view(t.shape)
    view.copy_(t)
    return view


def _gated_per_lane(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> int:
    """The warp kernel's lane width the launcher picks for these inputs (0: the block kernel);
    z contiguous or a fused-projection view (the layouts the launcher reads in place)."""
    token_stride = z.stride(0) if z.dim() == 3 and not z.is_contiguous() else z.shape[-1]
    spans = [(t.data_ptr(), t.element_size()) for t in (x, z, w)]
    spans.append((token_stride * z.element_size(), z.element_size()))
    return gated_cuda.plan_launch(x.shape[-1], x.numel() // x.shape[-1], spans).per_lane


@pytest.mark.parametrize(
    "tokens,num_k_heads,num_v_heads",
    [(2048, 16, 48), (8192, 16, 48), (2048, 16, 32), (1, 16, 48), (8, 16, 48), (3, 16, 32)],
    ids=["27b-2k", "27b-8k", "35b-2k", "27b-b1", "27b-b8", "35b-b3"],
)
def test_gated_rms_norm_fused_layout_matches_the_twin(tokens, num_k_heads, num_v_heads, gen):
    """The model's call: fp32 delta-rule output, z read in place, bf16 weight and output."""
    z = _fused_z(tokens, num_k_heads, num_v_heads, gen)
    x = torch.randn(tokens, num_v_heads, HEAD_DIM, device="cuda", generator=gen)
    w = torch.randn(HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    assert _gated_per_lane(x, z, w) == 4
    got = gated_cuda.gated_rms_norm(x, z, w, 1e-6, torch.bfloat16)
    want = gated_ref.gated_rms_norm(x, z.contiguous(), w, 1e-6, torch.bfloat16)
    assert got.shape == x.shape and got.dtype == torch.bfloat16
    assert rel(got, want) < 1e-2


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("w_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", [None, torch.bfloat16], ids=["keep", "bf16-out"])
@pytest.mark.parametrize("rows,n", [(21, 128), (384, 128), (5, 32), (6, 64), (9, 256), (7, 96)])
def test_gated_rms_norm_warp_and_block_paths(x_dtype, w_dtype, out_dtype, rows, n, gen) -> None:
    """Every lane width (and a width with none), rows not a multiple of a block's warps; the
    same inputs through the block kernel (x one element off alignment) agree with both."""
    x = torch.randn(rows, n, device="cuda", generator=gen).to(x_dtype)
    z = torch.randn(rows, n, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.randn(n, device="cuda", generator=gen).to(w_dtype)
    assert _gated_per_lane(x, z, w) == (n // 32 if n in (32, 64, 128, 256) else 0)
    x_before, z_before = x.clone(), z.clone()
    got = gated_cuda.gated_rms_norm(x, z, w, 1e-6, out_dtype)
    want = gated_ref.gated_rms_norm(x, z, w, 1e-6, out_dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert rel(got, want) < TOL[want.dtype]
    assert torch.equal(x, x_before) and torch.equal(z, z_before)  # inputs are only read
    if n == 32:  # one element a lane is always aligned: no input takes the block kernel
        return
    x_off = _shifted(x)
    assert _gated_per_lane(x_off, z, w) == 0
    block = gated_cuda.gated_rms_norm(x_off, z, w, 1e-6, out_dtype)
    assert rel(block, want) < TOL[want.dtype]
    assert rel(got, block) < TOL[want.dtype]


def test_gated_rms_norm_replays_in_a_cuda_graph(gen) -> None:
    z = _fused_z(8, 16, 48, gen)
    x = torch.randn(8, 48, HEAD_DIM, device="cuda", generator=gen)
    w = torch.randn(HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    graph, result = capture_graph(lambda: gated_cuda.gated_rms_norm(x, z, w, 1e-6, torch.bfloat16))
    x.copy_(torch.randn(x.shape, device="cuda", generator=gen))
    z.copy_(torch.randn(z.shape, device="cuda", generator=gen).to(torch.bfloat16))
    graph.replay()
    want = gated_ref.gated_rms_norm(x, z.contiguous(), w, 1e-6, torch.bfloat16)
    assert rel(result, want) < 1e-2
