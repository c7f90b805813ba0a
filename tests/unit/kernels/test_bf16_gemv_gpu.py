"""The bf16 GEMV kernel against an fp64 product and cuBLAS, in graphs and through dispatch (GPU).

Fresh random operands per test (the conftest `gen`). Tolerances, from how the kernel rounds: it
sums fp32 products (exact for bf16 operands) in fp32 and rounds each output once to bf16, so
against the fp64 product `exact` every element obeys |got - exact| <= 2^-8 |exact| + delta (half
a bf16 ulp is at most 2^-8 of the value; delta bounds the fp32 summation error, which is at most
~(K / 256 + 8) fp32 roundings deep: 2e-5 of sum |x| |w| covers K up to ~80,000 in the worst
case). The norm-relative error, ||got - exact|| / ||exact||, is then at most ~2^-8 = 3.9e-3 and
is held to the 1e-2 the other bf16 kernels use; against cuBLAS (two bf16 roundings) as well.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch
from ninfer.kernels.bf16_gemv import launch as bf16_cuda
from support.gpu_checks import bf16_operands, capture_graph, check_bf16_product, rel

pytestmark = pytest.mark.gpu
TOL = 1e-2

SHAPES = [
    pytest.param(2048, 4096, id="35b-out-proj"),
    pytest.param(5120, 6144, id="27b-out-proj"),
    pytest.param(12352, 2048, id="35b-in-proj"),
    pytest.param(2048, 512, id="35b-shared-down"),
    pytest.param(64, 2048, id="35b-in-proj-ba"),
    pytest.param(257, 2048, id="odd-n"),
    pytest.param(1003, 520, id="odd-n-k-off-the-warp-split"),
    pytest.param(37, 8, id="one-chunk"),
]


@pytest.mark.parametrize("rows", range(1, bf16_cuda.MAX_ROWS + 1))
@pytest.mark.parametrize("n,k", SHAPES)
def test_bf16_gemv_matches_fp64(rows: int, n: int, k: int, gen) -> None:
    x, w = bf16_operands(rows, n, k, gen)
    assert bf16_cuda.supports(x, w)
    got = bf16_cuda.bf16_linear(x, w)
    check_bf16_product(got, x, w)
    assert rel(got, F.linear(x, w)) < TOL
    assert torch.equal(bf16_cuda.bf16_linear(x, w), got)  # fixed reduction order


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("n,k", [(34816, 5120), (5120, 17408)], ids=["27b-gate-up", "27b-down"])
def test_bf16_gemv_wide_shapes(rows: int, n: int, k: int, gen) -> None:
    x, w = bf16_operands(rows, n, k, gen)
    check_bf16_product(bf16_cuda.bf16_linear(x, w), x, w)


def test_bf16_gemv_row_views_and_strided_x(gen) -> None:
    """A weight that is a row slice of a merged matrix (as the fused projections bind) and x
    rows with a 16-byte-multiple stride (a column slice of a wider tensor)."""
    x_wide, _ = bf16_operands(5, 1, 1024 + 64, gen)
    _, merged = bf16_operands(1, 3000, 1024, gen)
    w = merged[1000:2500]  # contiguous rows at an offset into the merged storage
    x = x_wide[:, 64:]  # rows of 1088 values: a 2176-byte stride
    assert w.storage_offset() > 0 and x.stride(0) == 1024 + 64 and bf16_cuda.supports(x, w)
    check_bf16_product(bf16_cuda.bf16_linear(x, w), x, w)


def test_bf16_gemv_is_recorded_by_a_cuda_graph(gen) -> None:
    x, w = bf16_operands(4, 2048, 4096, gen)
    graph, out = capture_graph(lambda: bf16_cuda.bf16_linear(x, w))
    x.copy_(torch.randn(4, 4096, device="cuda", generator=gen))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, bf16_cuda.bf16_linear(x, w))
    check_bf16_product(out, x, w)


def test_dispatch_routes_decode_rows_to_the_kernel(gen, monkeypatch) -> None:
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    monkeypatch.delenv("NINFER_KERNELS", raising=False)
    x, w = bf16_operands(3, 2048, 4096, gen)
    assert dispatch.bf16_gemv_routed(x, w)
    assert torch.equal(dispatch.linear(x, w), bf16_cuda.bf16_linear(x, w))
    # more rows than a decode batch, fp32 x, out_features past the table, strided x rows:
    # F.linear, bit for bit
    prefill = torch.randn(9, 4096, device="cuda", generator=gen).to(torch.bfloat16)
    wide_n = bf16_operands(2, bf16_cuda.MULTI_ROW_MAX_WEIGHTS // 4096 + 8, 4096, gen)
    odd_stride = torch.randn(3, 4100, device="cuda", generator=gen).to(torch.bfloat16)[:, :4096]
    for xx, ww in ((prefill, w), (x.float(), w.float()), wide_n, (odd_stride, w)):
        assert not dispatch.bf16_gemv_routed(xx, ww)
        assert torch.equal(dispatch.linear(xx, ww), F.linear(xx, ww))
    monkeypatch.setenv("NINFER_KERNELS_OFF", "bf16_gemv")
    assert not dispatch.bf16_gemv_routed(x, w)
    assert torch.equal(dispatch.linear(x, w), F.linear(x, w))


SWIGLU_SHAPES = [
    pytest.param(5120, 17408, id="27b-down"),
    pytest.param(2048, 512, id="35b-shared-down"),
    pytest.param(1003, 520, id="odd-n-k-off-the-warp-split"),
]


@pytest.mark.parametrize("rows", range(1, bf16_cuda.MAX_ROWS + 1))
@pytest.mark.parametrize("n,k", SWIGLU_SHAPES)
def test_swiglu_input_is_silu_mul_then_the_gemv_bit_for_bit(rows: int, n: int, k: int, gen) -> None:
    """The SwiGLU-input form forms x with common.cu's swiglu as silu_mul does, so it must give
    exactly the bits of the silu_mul kernel followed by the plain GEMV, strided rows included."""
    wide = torch.randn(rows, 2 * k + 16, device="cuda", generator=gen).to(torch.bfloat16) * 3
    gate_up = wide[:, : 2 * k]  # a row stride past 2K, as a slice of a wider output
    _, w = bf16_operands(rows, n, k, gen)
    want = bf16_cuda.bf16_linear(dispatch.silu_mul(gate_up).contiguous(), w)
    got = bf16_cuda.bf16_linear(gate_up, w, swiglu_input=True)
    assert torch.equal(got, want)
    check_bf16_product(got, dispatch.silu_mul(gate_up), w)


def test_swiglu_linear_routes_and_switches(gen, monkeypatch) -> None:
    """dispatch.swiglu_linear: the fused GEMV where the plain one is routed, else silu_mul then
    linear; `swiglu_gemv` in NINFER_KERNELS_OFF keeps the two launches, with the same bits."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    monkeypatch.delenv("NINFER_KERNELS", raising=False)
    gate_up = torch.randn(1, 2 * 17408, device="cuda", generator=gen).to(torch.bfloat16)
    _, w = bf16_operands(1, 5120, 17408, gen)
    assert dispatch.bf16_gemv_routed(gate_up, w, swiglu_input=True)
    fused = dispatch.swiglu_linear(gate_up, w)
    assert torch.equal(fused, dispatch.linear(dispatch.silu_mul(gate_up), w))
    graph, out = capture_graph(lambda: dispatch.swiglu_linear(gate_up, w))
    graph.replay()
    assert torch.equal(out, fused)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "swiglu_gemv")
    assert not dispatch.bf16_gemv_routed(gate_up, w, swiglu_input=True)
    assert dispatch.bf16_gemv_routed(dispatch.silu_mul(gate_up), w)
    assert torch.equal(dispatch.swiglu_linear(gate_up, w), fused)
    # four rows of the 27B's down projection: not the CUDA-core GEMV, so silu_mul then whatever
    # `linear` routes them to (the tensor-core GEMV since run Y1), with its bits
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    four = torch.randn(4, 2 * 17408, device="cuda", generator=gen).to(torch.bfloat16)
    assert not dispatch.bf16_gemv_routed(four, w, swiglu_input=True)
    activated = dispatch.silu_mul(four)
    assert torch.equal(dispatch.swiglu_linear(four, w), dispatch.linear(activated, w))
    check_bf16_product(dispatch.swiglu_linear(four, w), activated, w)


@pytest.mark.parametrize("rows", range(1, bf16_cuda.MAX_ROWS + 1))
@pytest.mark.parametrize(
    "n,heads,head_dim",
    [
        pytest.param(5120, 24, 256, id="27b-o-proj"),
        pytest.param(2048, 16, 256, id="35b-o-proj"),
        pytest.param(1003, 5, 104, id="odd-n-odd-heads"),
    ],
)
def test_sigmoid_gate_form_matches_the_eager_ops(
    rows: int, n: int, heads: int, head_dim: int, gen
) -> None:
    """x = o * sigmoid(gate) formed in the loads, the gate a strided view of a [M, H, 2, D]
    projection as the model slices it. Against the eager torch ops then the plain GEMV: the
    kernel's sigmoid uses the fast exp, so a gate element may round to the neighbouring bf16 of
    torch's; at most 1 % of the gated inputs may differ, by one bf16 ulp, and the outputs stay
    within the module's fp64 bounds."""
    o = torch.randn(rows, heads, head_dim, device="cuda", generator=gen).to(torch.bfloat16)
    qg = torch.randn(rows, heads, 2, head_dim, device="cuda", generator=gen) * 3
    gate = qg.to(torch.bfloat16)[:, :, 1]
    _, w = bf16_operands(rows, n, heads * head_dim, gen)
    x = o.reshape(rows, -1)
    gated = (o * torch.sigmoid(gate)).reshape(rows, -1)
    got = bf16_cuda.bf16_linear(x, w, gate=gate)
    check_bf16_product(got, gated, w)
    want = bf16_cuda.bf16_linear(gated.contiguous(), w)
    assert rel(got, want) < 1e-3
    # the gated inputs themselves, through a one-hot weight (row j of W picks input j)
    k = heads * head_dim
    eye = torch.eye(k, device="cuda", dtype=torch.bfloat16)[: min(k, 512)]
    picked = bf16_cuda.bf16_linear(x, eye, gate=gate)
    diff = picked != gated[:, : eye.shape[0]]
    assert diff.float().mean().item() <= 0.01
    ulp = (picked.float() - gated[:, : eye.shape[0]].float()).abs()
    assert (ulp[diff] <= gated[:, : eye.shape[0]].float().abs()[diff] * 2**-7).all()


def test_sigmoid_gate_linear_routes_and_switches(gen, monkeypatch) -> None:
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    monkeypatch.delenv("NINFER_KERNELS", raising=False)
    o = torch.randn(1, 24, 256, device="cuda", generator=gen).to(torch.bfloat16)
    gate = torch.randn(1, 24, 2, 256, device="cuda", generator=gen).to(torch.bfloat16)[:, :, 1]
    _, w = bf16_operands(1, 5120, 6144, gen)
    assert dispatch.bf16_gemv_routed(o.reshape(1, -1), w, gate=gate)
    fused = dispatch.sigmoid_gate_linear(o, gate, w)
    graph, out = capture_graph(lambda: dispatch.sigmoid_gate_linear(o, gate, w))
    graph.replay()
    assert torch.equal(out, fused)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "sigmoid_gate_gemv")
    eager = dispatch.sigmoid_gate_linear(o, gate, w)
    assert torch.equal(eager, dispatch.linear((o * torch.sigmoid(gate)).reshape(1, -1), w))
    assert rel(fused, eager) < 1e-3


@pytest.mark.parametrize("rows", [1, 4, 8])
@pytest.mark.parametrize("form", ["plain", "swiglu", "gate"])
def test_early_loads_give_the_same_bits(rows: int, form: str, gen, monkeypatch) -> None:
    """The early loads (the first weight loads before the dependency wait; on unless
    `NINFER_KERNELS_OFF=gemv_early_loads`) issue the same loads in the same order: every input
    form's outputs are bit-equal, eager and in a graph replay after the inputs changed."""
    heads, head_dim, n = 24, 256, 5120
    k = heads * head_dim
    x, w = bf16_operands(rows, n, k, gen)
    kwargs: dict = {}
    if form == "swiglu":
        x = torch.randn(rows, 2 * k, device="cuda", generator=gen).to(torch.bfloat16)
        kwargs = {"swiglu_input": True}
    elif form == "gate":
        qg = torch.randn(rows, heads, 2, head_dim, device="cuda", generator=gen) * 3
        kwargs = {"gate": qg.to(torch.bfloat16)[:, :, 1]}
    monkeypatch.setenv("NINFER_KERNELS_OFF", "gemv_early_loads")
    want = bf16_cuda.bf16_linear(x, w, **kwargs)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "")
    assert bf16_cuda.launch_options() & bf16_cuda.OPTION_EARLY_LOADS
    assert torch.equal(bf16_cuda.bf16_linear(x, w, **kwargs), want)
    graph, out = capture_graph(lambda: bf16_cuda.bf16_linear(x, w, **kwargs))
    x.copy_(torch.randn(x.shape, device="cuda", generator=gen).to(torch.bfloat16))
    graph.replay()
    monkeypatch.setenv("NINFER_KERNELS_OFF", "gemv_early_loads")
    assert torch.equal(out, bf16_cuda.bf16_linear(x, w, **kwargs))


@pytest.mark.parametrize("switch", ["gemv_rows8", "gemv_fused_rows8"])
@pytest.mark.parametrize(
    "n,k",
    [
        pytest.param(5120, 17408, id="27b-down"),
        pytest.param(34816, 5120, id="27b-gate-up"),
        pytest.param(1003, 520, id="odd-n-k-off-the-warp-split"),
    ],
)
def test_opt_in_eight_row_plan(switch: str, n: int, k: int, gen, monkeypatch) -> None:
    """The opt-in R = 8, U = 1 one-row plan (`gemv_rows8` for every form, `gemv_fused_rows8` for
    the fused forms only): each form within the fp64 bounds, repeatable; under `gemv_rows8` the
    SwiGLU form keeps the plain form's bits (both reduce in the R = 8 order); graph replays."""
    wide = torch.randn(1, 2 * k, device="cuda", generator=gen).to(torch.bfloat16) * 3
    _, w = bf16_operands(1, n, k, gen)
    activated = dispatch.silu_mul(wide).contiguous()
    monkeypatch.setenv("NINFER_KERNELS_ON", switch)
    assert bf16_cuda.wide_rows(1, fused=True)
    plain = bf16_cuda.bf16_linear(activated, w)
    fused = bf16_cuda.bf16_linear(wide, w, swiglu_input=True)
    check_bf16_product(plain, activated, w)
    check_bf16_product(fused, activated, w)
    assert torch.equal(bf16_cuda.bf16_linear(wide, w, swiglu_input=True), fused)
    if switch == "gemv_rows8":
        assert torch.equal(fused, plain)
    graph, out = capture_graph(lambda: bf16_cuda.bf16_linear(wide, w, swiglu_input=True))
    wide.copy_(torch.randn(1, 2 * k, device="cuda", generator=gen).to(torch.bfloat16))
    graph.replay()
    assert torch.equal(out, bf16_cuda.bf16_linear(wide, w, swiglu_input=True))
    # the sigmoid-gate form on a head layout that divides K
    heads, head_dim = k // 8, 8
    o = torch.randn(1, heads, head_dim, device="cuda", generator=gen).to(torch.bfloat16)
    gate = (torch.randn(1, heads, 2, head_dim, device="cuda", generator=gen) * 3).to(
        torch.bfloat16
    )[:, :, 1]
    got = bf16_cuda.bf16_linear(o.reshape(1, -1), w, gate=gate)
    check_bf16_product(got, (o * torch.sigmoid(gate)).reshape(1, -1), w)


GATE_UP_SHAPES = [
    pytest.param(2 * 17408, 5120, id="27b-gate-up"),
    pytest.param(2 * 512, 2048, id="35b-shared-gate-up"),  # small: R = 2, one pair per group
    pytest.param(2 * 2103, 520, id="odd-pairs-k-off-the-warp-split"),  # the last group partial
    pytest.param(2 * 2200, 8, id="one-chunk"),  # (pairs this many, so that R stays 2)
]


@pytest.mark.parametrize("switch", ["", "gemv_rows8"])
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
@pytest.mark.parametrize("n,k", GATE_UP_SHAPES)
def test_swiglu_output_is_the_gemv_then_silu_mul_bit_for_bit(
    switch: str, rows: int, n: int, k: int, gen, monkeypatch
) -> None:
    """The SwiGLU output form sums each gate and up row as the plain launch of the same R does
    and rounds as silu_mul reads them, so it must give exactly silu_mul(plain GEMV), at the
    default plan and the opt-in eight-row one; strided x rows; repeatable; graph replays."""
    monkeypatch.setenv("NINFER_KERNELS_ON", switch)
    wide = torch.randn(rows, k + 24, device="cuda", generator=gen).to(torch.bfloat16)
    x = wide[:, :k]
    _, w = bf16_operands(rows, n, k, gen)
    w = w * 4  # activations spread over silu's curve
    assert bf16_cuda.swiglu_output_problem(x, w) is None
    want = dispatch.silu_mul(bf16_cuda.bf16_linear(x, w))
    got = bf16_cuda.gate_up_swiglu(x, w)
    assert got.shape == (rows, n // 2)
    assert torch.equal(got, want)
    assert torch.equal(bf16_cuda.gate_up_swiglu(x, w), got)
    graph, out = capture_graph(lambda: bf16_cuda.gate_up_swiglu(x, w))
    wide.copy_(torch.randn(rows, k + 24, device="cuda", generator=gen).to(torch.bfloat16))
    graph.replay()
    assert torch.equal(out, dispatch.silu_mul(bf16_cuda.bf16_linear(x, w)))


def test_swiglu_output_refuses_odd_rows_and_tiny_weights(gen) -> None:
    x, w = bf16_operands(1, 1001, 512, gen)
    assert "even row count" in bf16_cuda.swiglu_output_problem(x, w)
    with pytest.raises(bf16_cuda.rt.KernelInputError, match="even row count"):
        bf16_cuda.gate_up_swiglu(x, w)
    x, w = bf16_operands(1, 4, 512, gen)  # two pairs: the plan's R is 1
    assert "too small" in bf16_cuda.swiglu_output_problem(x, w)


def test_swiglu_mlp_routes_and_switches_with_the_same_bits(gen, monkeypatch) -> None:
    """dispatch.swiglu_mlp: the gate-up GEMV's SwiGLU output then the plain down GEMV at one row
    by default, the down projection's SwiGLU input form under `NINFER_KERNELS_OFF=gate_up_swiglu`:
    the same bits either way, and the same as the unfused launches; four rows route as before."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    x, gate_up = bf16_operands(1, 2 * 17408, 5120, gen)
    _, down = bf16_operands(1, 5120, 17408, gen)
    default = dispatch.swiglu_mlp(x, gate_up, down)
    unfused = dispatch.linear(dispatch.silu_mul(dispatch.linear(x, gate_up)), down)
    assert torch.equal(default, unfused)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "gate_up_swiglu")
    assert torch.equal(dispatch.swiglu_mlp(x, gate_up, down), default)
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    graph, out = capture_graph(lambda: dispatch.swiglu_mlp(x, gate_up, down))
    x.copy_(torch.randn(1, 5120, device="cuda", generator=gen).to(torch.bfloat16))
    graph.replay()
    monkeypatch.setenv("NINFER_KERNELS_OFF", "gate_up_swiglu")
    assert torch.equal(out, dispatch.swiglu_mlp(x, gate_up, down))
    four, _ = bf16_operands(4, 2 * 17408, 5120, gen)
    off = dispatch.swiglu_mlp(four, gate_up, down)
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    assert torch.equal(off, dispatch.swiglu_mlp(four, gate_up, down))
