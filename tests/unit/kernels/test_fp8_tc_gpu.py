"""The tensor-core fp8 GEMV (`launch_tc`) against its torch twin and an fp64 product (GPU only).

Fresh random weights are quantized on the GPU (`artifact.quantize.quantize_fp8_block`). Each x
row is checked on its own (a per-row power-of-two scaling bug would hide in a whole-matrix norm):
bf16 within 1e-2 relative (the kernel takes bf16 x only; fp32 x is refused). Rows mix the hard
cases: entries beyond f16's 65,504, rows of 1e-30, rows of 1e30 with tiny entries.
"""

from __future__ import annotations

import pytest
import torch
from tests.support.gpu_checks import FP8_SHAPES, capture_graph, fp8_hard_rows, fp8_weight

from ninfer.artifact.quantize import quantize_fp8_block
from ninfer.kernels import dispatch
from ninfer.kernels.fp8_gemv import launch as core_cuda
from ninfer.kernels.fp8_gemv import launch_tc as tc_cuda
from ninfer.kernels.fp8_gemv import reference as fp8_ref
from ninfer.kernels.fp8_gemv.reference import Fp8Weight
from ninfer.kernels.fp8_gemv.tiles import pack_tiles

pytestmark = pytest.mark.gpu
TOL = 1e-2  # bf16 outputs
SHAPES = FP8_SHAPES


def _exact(x: torch.Tensor, weight: Fp8Weight) -> torch.Tensor:
    return x.double() @ fp8_ref.dequantize(weight.weight, weight.scale_inv, torch.float64).T


def _assert_rows_close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    assert torch.isfinite(got).all(), f"non-finite values in the kernel's result ({what})"
    for r in range(got.shape[0]):
        err = ((got[r].double() - want[r].double()).norm() / want[r].double().norm()).item()
        assert err < tol, f"x row {r}: relative error {err:.2e} against the {what}"


@pytest.mark.parametrize("rows", [1, 2, 5, 8])
@pytest.mark.parametrize("n,k", SHAPES)
def test_tc_gemv_matches_twin_and_fp64(rows: int, n: int, k: int, gen) -> None:
    dtype = torch.bfloat16
    weight = fp8_weight(n, k)
    x = fp8_hard_rows(rows, k, gen, dtype)
    assert tc_cuda.supports(x, weight)
    got = tc_cuda.fp8_linear(x, weight)
    assert got.shape == (rows, n) and got.dtype == dtype
    _assert_rows_close(got, _exact(x, weight), TOL, "fp64 product")
    if n >= 128:
        # The bf16 twin rounds its dequantized weights and its result to bf16: on rows of a few
        # outputs with cancellation it is itself ~3 bf16 ulps (1.2e-2) off the fp64 product (seen
        # on the H200 at n = 1), so narrow shapes are held to the fp64 product alone.
        _assert_rows_close(got, fp8_ref.fp8_linear(x, weight), TOL, "twin")


@pytest.mark.parametrize("splits", tc_cuda.SPLITS)
@pytest.mark.parametrize("n,k", [(640, 2048), (300, 272), (5120, 5120)])
def test_every_split_count_gives_the_product(splits: int, n: int, k: int, gen) -> None:
    """Each cluster size, including splits left without k blocks (k = 272: 3 blocks, 8 splits)."""
    weight = fp8_weight(n, k)
    x = fp8_hard_rows(8, k, gen, torch.bfloat16)
    got = tc_cuda.fp8_linear(x, weight, splits=splits)
    _assert_rows_close(got, _exact(x, weight), TOL, f"fp64 product, {splits} splits")


@pytest.mark.parametrize("stages", tc_cuda.STAGES)
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("n,k", [(34816, 5120), (5120, 17408), (130, 4112), (300, 272), (48, 64)])
def test_ring_form_gives_the_register_forms_bits(stages: int, rows: int, n: int, k: int, gen):
    """Same mma in the same order: every ring depth equals the register form bit for bit, at
    every split count (k blocks fewer than the ring's depth included: k = 64, 272)."""
    weight = fp8_weight(n, k)
    x = fp8_hard_rows(rows, k, gen, torch.bfloat16)
    for splits in (None, *tc_cuda.SPLITS):
        want = tc_cuda.fp8_linear(x, weight, splits=splits, stages=0)
        got = tc_cuda.fp8_linear(x, weight, splits=splits, stages=stages)
        assert torch.equal(got, want), f"{splits} splits"
    _assert_rows_close(got, _exact(x, weight), TOL, f"fp64 product, ring of {stages}")


@pytest.mark.parametrize("rows", [1, 4, 5, 8])
@pytest.mark.parametrize("n,k", [(5120, 17408), (16480, 5120), (130, 4112), (300, 272)])
def test_half_staged_chunks_give_the_same_bits(rows: int, n: int, k: int, gen, monkeypatch):
    """x staged 8 k blocks at a time (the same values, twice as many chunks, a deeper ring from
    3 rows: routed there) equals the 16-block chunks bit for bit, plain and SwiGLU input, at
    every ring depth; `fp8_chunk8` off routes 16-block chunks."""
    weight = fp8_weight(n, k)
    x = fp8_hard_rows(rows, k, gen, torch.bfloat16)
    for stages in tc_cuda.STAGES:
        want = tc_cuda.fp8_linear(x, weight, stages=stages, chunk=16)
        assert torch.equal(tc_cuda.fp8_linear(x, weight, stages=stages, chunk=8), want), stages
    gate_up = (torch.randn(rows, 2 * k, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    want = tc_cuda.fp8_linear(gate_up, weight, swiglu_input=True, chunk=16)
    assert torch.equal(tc_cuda.fp8_linear(gate_up, weight, swiglu_input=True, chunk=8), want)
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    assert tc_cuda.ring_chunk(rows) == (8 if rows >= tc_cuda.CHUNK8_MIN_ROWS else 16)
    routed = tc_cuda.fp8_linear(x, weight)
    assert torch.equal(routed, tc_cuda.fp8_linear(x, weight, stages=0))  # the register form's
    monkeypatch.setenv("NINFER_KERNELS_OFF", "fp8_chunk8")
    assert tc_cuda.ring_chunk(rows) == 16
    assert torch.equal(tc_cuda.fp8_linear(x, weight), routed)
    with pytest.raises(tc_cuda.Fp8TcError, match="staged x chunks"):
        tc_cuda.fp8_linear(x, weight, chunk=tc_cuda.FIT_CHUNK_MAX + 1)


@pytest.mark.parametrize("rows", [1, 4, 8])
@pytest.mark.parametrize("n,k", [(5120, 17408), (14336, 5120), (130, 4112), (300, 272)])
def test_fitted_chunks_and_plans_give_the_same_bits(rows: int, n: int, k: int, gen, monkeypatch):
    """Chunks of any size up to FIT_CHUNK_MAX (one staging of a split of 17 k blocks, uneven
    ones, the largest) and the opt-in plans `fp8_fit_chunk` / `fp8_four_per_sm` equal the
    16-block chunks bit for bit, plain and SwiGLU input, at every split count."""
    weight = fp8_weight(n, k)
    x = fp8_hard_rows(rows, k, gen, torch.bfloat16)
    gate_up = (torch.randn(rows, 2 * k, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    for splits in tc_cuda.SPLITS:
        want = tc_cuda.fp8_linear(x, weight, splits=splits, stages=2, chunk=16)
        for chunk in (3, 9, 10, 13, 17, tc_cuda.FIT_CHUNK_MAX):
            got = tc_cuda.fp8_linear(x, weight, splits=splits, stages=2, chunk=chunk)
            assert torch.equal(got, want), (splits, chunk)
        swiglu = {"splits": splits, "swiglu_input": True}
        swiglu_want = tc_cuda.fp8_linear(gate_up, weight, chunk=16, **swiglu)
        assert torch.equal(tc_cuda.fp8_linear(gate_up, weight, chunk=17, **swiglu), swiglu_want)
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    routed = tc_cuda.fp8_linear(x, weight)
    routed_swiglu = tc_cuda.fp8_linear(gate_up, weight, swiglu_input=True)
    for switch in ("fp8_fit_chunk", "fp8_four_per_sm", "fp8_fit_chunk,fp8_four_per_sm"):
        monkeypatch.setenv("NINFER_KERNELS_ON", switch)
        assert torch.equal(tc_cuda.fp8_linear(x, weight), routed), switch
        assert torch.equal(tc_cuda.fp8_linear(gate_up, weight, swiglu_input=True), routed_swiglu)


@pytest.mark.parametrize("rows", [1, 2, 5, 8])
@pytest.mark.parametrize("n,k", [(5120, 17408), (130, 4112), (300, 272), (48, 64)])
def test_swiglu_input_gives_silu_mul_then_the_gemv(rows: int, n: int, k: int, gen) -> None:
    """The ring form's SwiGLU input stages swiglu(gate, up) rounded as silu_mul writes it, so it
    equals silu_mul then the plain kernel bit for bit, at every split count and from rows of a
    wider buffer (row stride past 2K)."""
    weight = fp8_weight(n, k)
    wide = torch.randn(rows, 2 * k + 64, device="cuda", generator=gen) * 3
    gate_up = wide.to(torch.bfloat16)[:, : 2 * k]
    assert tc_cuda.supports_swiglu(gate_up, weight)
    act = dispatch.silu_mul(gate_up.contiguous())
    for splits in (None, 1, 8):
        want = tc_cuda.fp8_linear(act, weight, splits=splits)
        got = tc_cuda.fp8_linear(gate_up, weight, splits=splits, swiglu_input=True)
        assert torch.equal(got, want), f"{splits} splits"
    _assert_rows_close(got, _exact(act, weight), TOL, "fp64 product of the activated rows")


def test_swiglu_routing_and_checks(gen, monkeypatch) -> None:
    weight = fp8_weight(5120, 17408)
    gate_up = torch.randn(2, 2 * 17408, device="cuda", generator=gen).to(torch.bfloat16)
    eight = torch.randn(8, 2 * 17408, device="cuda", generator=gen).to(torch.bfloat16)
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    assert tc_cuda.swiglu_routed(gate_up, weight)  # 1..SWIGLU_MAX_ROWS by default
    assert not tc_cuda.swiglu_routed(eight, weight)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "fp8_swiglu")
    assert not tc_cuda.swiglu_routed(gate_up, weight)
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    monkeypatch.setenv("NINFER_KERNELS_ON", "fp8_swiglu")  # every row count (A/B)
    assert tc_cuda.swiglu_routed(eight, weight)
    assert tc_cuda.swiglu_routed(gate_up, weight)
    want = tc_cuda.fp8_linear(dispatch.silu_mul(gate_up), weight)
    assert torch.equal(dispatch.swiglu_linear(gate_up, weight), want)
    assert not tc_cuda.swiglu_routed(gate_up[:, :17408], weight)  # not twice K wide
    monkeypatch.setenv("NINFER_KERNELS_OFF", "fp8_ring")  # the register form has no such input
    assert not tc_cuda.swiglu_routed(gate_up, weight)
    with pytest.raises(tc_cuda.Fp8TcError, match="ring form only"):
        tc_cuda.fp8_linear(gate_up, weight, swiglu_input=True)
    assert torch.equal(dispatch.swiglu_linear(gate_up, weight), tc_cuda.fp8_linear(
        dispatch.silu_mul(gate_up), weight, stages=0))  # fmt: skip
    with pytest.raises(tc_cuda.Fp8TcError, match="SwiGLU input form needs"):
        tc_cuda.fp8_linear(gate_up[:, :17408], weight, swiglu_input=True)


def test_ring_switch_and_stage_checks(gen, monkeypatch) -> None:
    weight = fp8_weight(5120, 6144)
    x = fp8_hard_rows(1, 6144, gen, torch.bfloat16)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "fp8_ring")
    assert tc_cuda.ring_stages(1) == 0
    assert torch.equal(dispatch.linear(x, weight), tc_cuda.fp8_linear(x, weight, stages=0))
    with pytest.raises(tc_cuda.Fp8TcError, match="ring stages"):
        tc_cuda.fp8_linear(x, weight, stages=5)


def test_result_is_deterministic_and_row_views_work(gen) -> None:
    fused = fp8_weight(34816, 5120)
    x = fp8_hard_rows(3, 5120, gen, torch.bfloat16)
    first = tc_cuda.fp8_linear(x, fused, splits=2)
    assert torch.equal(first, tc_cuda.fp8_linear(x, fused, splits=2))  # fixed reduction order
    part = fused.rows(17408, 34816)  # the up half of a merged gate-up: views with own scales
    # the same split count gives each row block the same k ranges, so the same sums bit for bit
    assert torch.equal(tc_cuda.fp8_linear(x, part, splits=2), first[:, 17408:])


def test_dispatch_runs_tc_first_and_the_switch_falls_back(gen, monkeypatch) -> None:
    weight = fp8_weight(5120, 6144)
    wide = torch.randn(2, 8192, device="cuda", generator=gen).to(torch.bfloat16)
    x = wide[:, 1024:7168]  # a column slice: dispatch makes it contiguous
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    assert torch.equal(dispatch.linear(x, weight), tc_cuda.fp8_linear(x.contiguous(), weight))
    monkeypatch.setenv("NINFER_KERNELS_OFF", "fp8_tc")
    assert torch.equal(dispatch.linear(x, weight), core_cuda.fp8_linear(x.contiguous(), weight))


def test_tc_gemv_replays_in_a_cuda_graph(gen) -> None:
    weight = fp8_weight(5120, 5120)  # 8 splits: a cluster launch inside the graph
    x = fp8_hard_rows(4, 5120, gen, torch.bfloat16)
    graph, out = capture_graph(lambda: tc_cuda.fp8_linear(x, weight))
    x.copy_(fp8_hard_rows(4, 5120, gen, torch.bfloat16))  # new inputs, same buffer
    graph.replay()
    torch.cuda.synchronize()
    _assert_rows_close(out, _exact(x, weight), 1e-2, "fp64 product after replay")


def test_tc_gemv_rejects_what_it_does_not_take(gen) -> None:
    weight = fp8_weight(48, 64)

    def x(rows: int, k: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(rows, k, device="cuda").to(dtype)

    assert tc_cuda.supports(x(1, 64), weight)
    assert not tc_cuda.supports(x(9, 64), weight)  # > MAX_ROWS
    assert not tc_cuda.supports(x(1, 64, torch.float32), weight)  # fp32 x: the CUDA-core GEMV
    odd = Fp8Weight(*quantize_fp8_block(torch.randn(48, 72, device="cuda")))  # K % 16 != 0
    assert not tc_cuda.supports(x(1, 72), odd)
    with pytest.raises(tc_cuda.Fp8TcError, match="tensor-core fp8 GEMV"):
        tc_cuda.fp8_linear(x(9, 64), weight)
    with pytest.raises(tc_cuda.Fp8TcError, match="splits"):
        tc_cuda.fp8_linear(x(1, 64), weight, splits=3)


@pytest.mark.parametrize("rows", [1, 4, 8])
@pytest.mark.parametrize("n,k", [(5120, 17408), (16384, 5120), (300, 272), (130, 4112), (48, 64)])
def test_packed_tiles_give_the_row_major_bits(rows: int, n: int, k: int, gen) -> None:
    """The same bytes land in the same ring slots from the tiles (zero-padded past N and K):
    equal to the row-major launch bit for bit at every split count and ring depth, the SwiGLU
    input form too, and for a row view of a packed fused matrix."""
    plain = fp8_weight(n, k)
    packed = Fp8Weight(plain.weight, plain.scale_inv, pack_tiles(plain.weight))
    x = fp8_hard_rows(rows, k, gen, torch.bfloat16)
    for splits in (None, *tc_cuda.SPLITS):
        for stages in (None, 2, 4):
            want = tc_cuda.fp8_linear(x, plain, splits=splits, stages=stages)
            got = tc_cuda.fp8_linear(x, packed, splits=splits, stages=stages)
            assert torch.equal(got, want), f"{splits} splits, {stages} stages"
    gate_up = (torch.randn(rows, 2 * k, device="cuda", generator=gen) * 3).to(torch.bfloat16)
    want = tc_cuda.fp8_linear(gate_up, plain, swiglu_input=True)
    assert torch.equal(tc_cuda.fp8_linear(gate_up, packed, swiglu_input=True), want)
    if n > 256:
        view = packed.rows(128, n)
        assert view.tiles is not None
        assert torch.equal(tc_cuda.fp8_linear(x, view), tc_cuda.fp8_linear(x, plain)[:, 128:])


def test_packed_tiles_are_checked_and_the_register_form_ignores_them(gen, monkeypatch) -> None:
    plain = fp8_weight(300, 272)
    x = fp8_hard_rows(2, 272, gen, torch.bfloat16)
    packed = Fp8Weight(plain.weight, plain.scale_inv, pack_tiles(plain.weight))
    want = tc_cuda.fp8_linear(x, plain, stages=0)
    assert torch.equal(tc_cuda.fp8_linear(x, packed, stages=0), want)  # rows read as before
    monkeypatch.setenv("NINFER_KERNELS_OFF", "fp8_tiles")  # bound, but the rows are read
    broken = Fp8Weight(plain.weight, plain.scale_inv, torch.zeros_like(packed.tiles))
    assert torch.equal(tc_cuda.fp8_linear(x, broken), tc_cuda.fp8_linear(x, plain))
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    assert not torch.equal(tc_cuda.fp8_linear(x, broken), tc_cuda.fp8_linear(x, plain))
    wrong = Fp8Weight(plain.weight, plain.scale_inv, pack_tiles(plain.weight[:256]))
    with pytest.raises(tc_cuda.Fp8TcError, match="not a dense packing"):
        tc_cuda.fp8_linear(x, wrong)


def test_long_k_tiles_bind_and_read_only_long_rows(gen, monkeypatch) -> None:
    """`NINFER_KERNELS_ON=fp8_tiles,long_k_tiles`: `_tiled` packs only projections of K >=
    LONG_K_TILES, and a launch reads tiles only there (zeroed tiles of a short-K weight are
    never read; of a long-K one they are)."""
    from ninfer.model.layers.mlp import MlpWeights
    from ninfer.model.qwen3_5 import _tiled

    k = tc_cuda.LONG_K_TILES
    short, long = fp8_weight(512, 256), fp8_weight(256, k)
    monkeypatch.setenv("NINFER_KERNELS_ON", "fp8_tiles,long_k_tiles")
    fresh = [Fp8Weight(w.weight.clone(), w.scale_inv) for w in (short, short, long)]
    bound = _tiled(MlpWeights(gate_proj=fresh[0], up_proj=fresh[1], down_proj=fresh[2]))
    assert bound.gate_proj.tiles is None and bound.down_proj.tiles is not None
    for w, reads in ((short, False), (long, True)):
        x = fp8_hard_rows(2, w.shape[1], gen, torch.bfloat16)
        zeroed = Fp8Weight(w.weight, w.scale_inv, torch.zeros_like(pack_tiles(w.weight)))
        same = torch.equal(tc_cuda.fp8_linear(x, zeroed), tc_cuda.fp8_linear(x, w))
        assert same != reads, f"K = {w.shape[1]}"
