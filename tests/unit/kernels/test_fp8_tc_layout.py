"""The tensor-core fp8 GEMV's bit tricks, fragment layout and x scaling, emulated on the CPU.

No GPU here, so each claim `fp8_tc_gemv` (fp8_gemv.cu) rests on is checked against an independent
reference: the e4m3 -> f16 shift against torch's own e4m3 decoding for all 256 bytes; the packed
prmt/shift/mask path against that per-byte rule; the lane -> fragment mapping (PTX ISA layout of
mma.m16n8k16: A row g / g + 8, cols 2t + e / 2t + 8 + e; B row 2t + e / 2t + 8 + e, col g)
against a plain matrix product; the per-(row, k block) power-of-two x scaling against fp64. The
constants below mirror the .cu (selectors 0xA280 / 0xB391, mask 0xbf80bf80, s = min(141 - e, 100)).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer.artifact.quantize import quantize_fp8_block
from ninfer.kernels.fp8_gemv import launch_tc
from ninfer.kernels.fp8_gemv.reference import Fp8Weight, dequantize

SEL_LO, SEL_HI, MASK = 0xA280, 0xB391, 0xBF80BF80
NAN_BYTES = (0x7F, 0xFF)  # e4m3fn NaN; the quantizer clamps to +-448 and never writes them


def _e4m3_bytes(shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    b = rng.integers(0, 256, size=shape, dtype=np.uint8)
    return np.where(np.isin(b, NAN_BYTES), np.uint8(0x3C), b).astype(np.uint8)


def _byte_rule(b: np.ndarray) -> np.ndarray:
    """f16 bits of one e4m3 byte times 2^-8 (the claim under test)."""
    b = b.astype(np.uint32)
    return (((b & 0x7F) << 7) | ((b & 0x80) << 8)).astype(np.uint16)


def _prmt_sign_extend(w: np.ndarray, sel: int) -> np.ndarray:
    """PTX prmt.b32 d, w, w, sel (default mode): nibble bits 0-2 pick a byte, bit 3 sign-fills."""
    out = np.zeros_like(w)
    for pos in range(4):
        nib = (sel >> (4 * pos)) & 0xF
        byte = (w >> np.uint32(8 * (nib & 3))) & np.uint32(0xFF)
        if nib & 8:
            byte = np.where(byte & 0x80, np.uint32(0xFF), np.uint32(0))
        out |= byte << np.uint32(8 * pos)
    return out


def _word_to_f16x2(w: np.ndarray, sel: int) -> np.ndarray:
    return (_prmt_sign_extend(w, sel) << np.uint32(7)) & np.uint32(MASK)


def _halves(v: np.ndarray) -> np.ndarray:
    """uint32 f16x2 words -> float64 [..., 2] (low half first)."""
    lo = (v & np.uint32(0xFFFF)).astype(np.uint16).view(np.float16)
    hi = (v >> np.uint32(16)).astype(np.uint16).view(np.float16)
    return np.stack([lo, hi], axis=-1).astype(np.float64)


def test_e4m3_to_f16_shift_is_exact_for_every_byte() -> None:
    b = np.array([v for v in range(256) if v not in NAN_BYTES], dtype=np.uint8)
    want = torch.from_numpy(b).view(torch.float8_e4m3fn).double().numpy()
    got = _byte_rule(b).view(np.float16).astype(np.float64)
    np.testing.assert_array_equal(got * 256.0, want)  # normals, subnormals and both zeros
    assert np.signbit(got[b == 0x80]).all()
    assert (np.abs(want[(b & 0x78) == 0]) < 2.0**-6).all()  # the subnormals really were covered


def test_packed_word_path_equals_the_byte_rule_for_all_byte_pairs() -> None:
    rng = np.random.default_rng(7)
    pair = np.arange(65536, dtype=np.uint32)
    first, second = pair & 0xFF, pair >> 8
    other = rng.integers(0, 256, size=(2, pair.size), dtype=np.uint32)
    # (b0, b2) exhaustive with random b1, b3, then (b1, b3) exhaustive with random b0, b2
    for sel, lo_pos, hi_pos in ((SEL_LO, 0, 2), (SEL_HI, 1, 3)):
        w = np.zeros(pair.size, dtype=np.uint32)
        rest = [p for p in range(4) if p not in (lo_pos, hi_pos)]
        w |= first << np.uint32(8 * lo_pos)
        w |= second << np.uint32(8 * hi_pos)
        w |= other[0] << np.uint32(8 * rest[0])
        w |= other[1] << np.uint32(8 * rest[1])
        got = _word_to_f16x2(w, sel)
        want = _byte_rule(first).astype(np.uint32) | (_byte_rule(second).astype(np.uint32) << 16)
        np.testing.assert_array_equal(got, want)


def test_lane_fragments_reproduce_the_tile_product() -> None:
    """One warp, one 128-wide k block: the kernel's loads, staging order and mma operands."""
    rng = np.random.default_rng(3)
    w_bytes = _e4m3_bytes((16, 128), rng)
    x = rng.standard_normal((8, 128)).astype(np.float16)
    # x staged per group of 4 as x0 x2 x1 x3 (stage_x)
    xs = x.view(np.uint16).reshape(8, 32, 4)[:, :, [0, 2, 1, 3]].reshape(8, 128).astype(np.uint32)
    words = w_bytes.view("<u4").astype(np.uint32)  # [16 rows, 32 words], little endian
    d = np.zeros((16, 8))
    out = np.zeros((8, 16))  # red[x row][weight row]
    for h in range(2):
        for i in range(4):
            a_tile, b_tile = np.zeros((16, 16)), np.zeros((16, 8))
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                col = (64 * h + 16 * t + 4 * i) // 4  # word of row g / g + 8 this lane holds
                wg, wg8 = words[g, col], words[g + 8, col]
                regs = [
                    _word_to_f16x2(np.array([v], np.uint32), s)[0]
                    for v, s in ((wg, SEL_LO), (wg8, SEL_LO), (wg, SEL_HI), (wg8, SEL_HI))
                ]
                a = _halves(np.array(regs, dtype=np.uint32))
                base = 64 * h + 16 * t + 4 * i
                b0 = xs[g, base] | (xs[g, base + 1] << 16)
                b1 = xs[g, base + 2] | (xs[g, base + 3] << 16)
                b = _halves(np.array([b0, b1], dtype=np.uint32))
                for e in range(2):  # PTX fragment layout of m16n8k16 (f16 A row, B col)
                    a_tile[g, 2 * t + e] = a[0, e]
                    a_tile[g + 8, 2 * t + e] = a[1, e]
                    a_tile[g, 2 * t + 8 + e] = a[2, e]
                    a_tile[g + 8, 2 * t + 8 + e] = a[3, e]
                    b_tile[2 * t + e, g] = b[0, e]
                    b_tile[2 * t + 8 + e, g] = b[1, e]
            d += a_tile @ b_tile
    for lane in range(32):  # accumulator c0..c3 -> red[col][row] as the epilogue writes it
        g, t = lane >> 2, lane & 3
        out[2 * t, g], out[2 * t + 1, g] = d[g, 2 * t], d[g, 2 * t + 1]
        out[2 * t, g + 8], out[2 * t + 1, g + 8] = d[g + 8, 2 * t], d[g + 8, 2 * t + 1]
    w_true = torch.from_numpy(w_bytes).view(torch.float8_e4m3fn).double().numpy()
    want = x.astype(np.float64) @ w_true.T / 256.0
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def _emulate_tc(x: torch.Tensor, weight: Fp8Weight) -> torch.Tensor:
    """The kernel's arithmetic: x scaled per (row, k block) into f16, weights as f16 * 2^-8."""
    n, k = weight.shape
    num_kb = weight.scale_inv.shape[1]
    xp = torch.zeros(x.shape[0], num_kb * 128)
    xp[:, :k] = x.float()
    xb = xp.reshape(x.shape[0], num_kb, 128)
    e = (xb.abs().view(torch.int32).amax(-1) >> 23).long()
    s = torch.clamp(141 - e, max=100).float()  # [M, kb]
    xh = (xb * torch.exp2(s)[..., None]).to(torch.float16).double()
    wb = torch.zeros(n, num_kb * 128, dtype=torch.uint8)
    wb[:, :k] = weight.weight.view(torch.uint8)
    wh = torch.from_numpy(_byte_rule(wb.numpy()).view(np.float16)).double()
    frag = torch.einsum("mbk,nbk->mnb", xh, wh.reshape(n, num_kb, 128)).float()
    row_scale = weight.scale_inv.repeat_interleave(128, 0)[:n]  # [n, kb]
    comb = row_scale[None] * 256.0 * torch.exp2(-s)[:, None, :]
    return (frag * comb).sum(-1)


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 1e-5)])
def test_block_power_of_two_scaling_keeps_extreme_x_exact(dtype: torch.dtype, tol: float) -> None:
    g = torch.Generator().manual_seed(11)
    n, k = 200, 400  # both off the 128 grid
    q, s = quantize_fp8_block(torch.randn(n, k, generator=g) * 0.05)
    weight = Fp8Weight(q, s)
    x = torch.randn(5, k, generator=g)
    x[1, ::37] *= 1e5  # beyond f16's 65,504
    x[2] *= 1e-30  # below f16's smallest subnormal, and below 2^-64 (the clamp matters)
    x[3] *= 1e30
    x[3, ::3] *= 1e-33  # tiny and huge in one row
    x[4] = 0.0
    x = x.to(dtype)
    assert torch.isinf(x[1].to(torch.float16)).any() and (x[2].to(torch.float16) == 0).all()
    exact = x.double() @ dequantize(weight.weight, weight.scale_inv, torch.float64).T
    got = _emulate_tc(x, weight).double()
    for row in range(4):
        err = (got[row] - exact[row]).norm() / exact[row].norm()
        assert err < tol, f"row {row}: relative error {err:.2e}"
    assert (got[4] == 0).all()


def test_split_count_rules(monkeypatch) -> None:
    """At least the one-wave count; more where every split keeps MIN_SPLIT_K_BLOCKS k blocks;
    never more splits than k blocks; the switch keeps the one-wave rule alone."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    sms = 132
    capacity = launch_tc.BLOCKS_PER_SM * sms
    for n, k in [
        (34816, 5120),
        (5120, 17408),
        (16480, 5120),
        (5120, 6144),
        (14336, 5120),
        (12352, 2048),
        (1000, 272),
        (48, 64),
        (248320, 5120),
    ]:
        rb, kb = -(-n // 128), -(-k // 128)
        splits = launch_tc.choose_splits(rb, kb, sms)
        assert splits in launch_tc.SPLITS and splits <= max(1, kb)
        one_wave = max(s for s in launch_tc.SPLITS if s == 1 or (s <= kb and rb * s <= capacity))
        short = max(
            s for s in launch_tc.SPLITS if s == 1 or kb // s >= launch_tc.MIN_SPLIT_K_BLOCKS
        )
        assert splits == max(one_wave, short), (n, k)
    # the 27B's wide projections (40 k blocks): 4 splits; its down (136) and out (48): 8
    assert launch_tc.choose_splits(272, 40, sms) == 4
    assert launch_tc.choose_splits(129, 40, sms) == 4
    assert launch_tc.choose_splits(40, 136, sms) == 8
    assert launch_tc.choose_splits(40, 48, sms) == 8
    monkeypatch.setenv("NINFER_KERNELS_OFF", "tc_wide_grid")
    assert launch_tc.choose_splits(272, 40, sms) == 1  # one wave: 272 blocks


def test_supports_declines_without_touching_cuda() -> None:
    q, s = quantize_fp8_block(torch.randn(64, 256))
    weight = Fp8Weight(q, s)
    assert not launch_tc.supports(torch.randn(1, 256, dtype=torch.bfloat16), weight)  # CPU x
    assert not launch_tc.supports(torch.randn(1, 128, dtype=torch.bfloat16), weight)  # K differs


def test_every_routed_ring_depth_keeps_three_blocks_per_sm(monkeypatch) -> None:
    """The ring's shared memory (ring + staged x + scales) must leave room for the 3 blocks per
    SM the split plan counts on; a deeper ring than fits would halve the resident grid. The
    routed depth is the deepest that fits with the routed staging (8 k blocks from 3 rows), and
    `fp8_chunk8` off stages 16 at every row count with the older depths (X1's: 2 from 5 rows,
    where a third would fit)."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    for off, table in (
        ("", launch_tc.RING_STAGES),
        ("fp8_chunk8", launch_tc.RING_STAGES_FULL_CHUNK),
    ):
        monkeypatch.setenv("NINFER_KERNELS_OFF", off)
        for rows in range(1, launch_tc.MAX_ROWS + 1):
            stages, chunk = launch_tc.ring_stages(rows), launch_tc.ring_chunk(rows)
            assert stages == table[rows] and stages in launch_tc.STAGES
            assert chunk == (8 if rows >= launch_tc.CHUNK8_MIN_ROWS and not off else 16)
            per_block = launch_tc.ring_shared_bytes(rows, stages, chunk) + 1024  # + reserved KiB
            assert launch_tc.BLOCKS_PER_SM * per_block <= launch_tc.SHARED_PER_SM, (rows, stages)
            if not off and stages < max(launch_tc.STAGES):  # the deepest that fits
                deeper = launch_tc.ring_shared_bytes(rows, stages + 1, chunk) + 1024
                assert launch_tc.BLOCKS_PER_SM * deeper > launch_tc.SHARED_PER_SM, rows
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    assert launch_tc.ring_stages(4) == 4  # the MTP verify's rows: a stage deeper than 16-chunks
    assert launch_tc.ring_shared_bytes(3, 3) == launch_tc.ring_shared_bytes(3, 3, launch_tc.CHUNK)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "fp8_ring")
    assert launch_tc.ring_stages(1) == 0


def _shared_per_block(rows: int, stages: int, chunk: int) -> int:
    return launch_tc.ring_shared_bytes(rows, stages, chunk) + launch_tc.RESERVED_PER_BLOCK


def test_fit_chunk_stages_a_split_once_where_it_fits() -> None:
    """`fit_chunk` is the fewest stagings the shared memory allows, chunks as even as that
    makes them, and what it returns fits the blocks per SM it was asked for (worked cases: the
    27B's K = 5,120 splits of 10 k blocks and the down projection's of 17)."""
    per_sm = launch_tc.SHARED_PER_SM
    for rows in range(1, launch_tc.MAX_ROWS + 1):
        for stages in launch_tc.STAGES:
            for blocks in (3, 4):
                for split_kb in (1, 5, 6, 10, 17, 34, 40, 136):
                    chunk = launch_tc.fit_chunk(rows, stages, split_kb, blocks)
                    if chunk == 0:
                        assert blocks * _shared_per_block(rows, stages, 1) > per_sm
                        continue
                    assert 1 <= chunk <= launch_tc.FIT_CHUNK_MAX
                    assert blocks * _shared_per_block(rows, stages, chunk) <= per_sm
                    stagings = -(-split_kb // chunk)
                    most = max(
                        c
                        for c in range(1, launch_tc.FIT_CHUNK_MAX + 1)
                        if blocks * _shared_per_block(rows, stages, c) <= per_sm
                    )
                    assert stagings == -(-split_kb // most), (rows, stages, blocks, split_kb)
                    assert chunk * stagings - split_kb < stagings  # as even as it gets
    assert launch_tc.fit_chunk(4, 4, 10, 3) == 10  # the MTP verify's rows (8-block chunks: twice)
    assert launch_tc.fit_chunk(1, 4, 17, 3) == 17  # 16-block chunks stage the 17th alone
    assert launch_tc.fit_chunk(4, 4, 17, 3) == 9
    assert launch_tc.fit_chunk(8, 3, 10, 3) == 10


def test_ring_plan_refinements_are_opt_in_and_fit(monkeypatch) -> None:
    """Without switches `ring_plan` is `ring_stages` / `ring_chunk`; `fp8_fit_chunk` keeps the
    depth and stages each split once where that fits 3 blocks an SM; `fp8_four_per_sm` acts only
    on grids of 3-4 blocks an SM and then fits 4 blocks an SM."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    sms = 132
    cases = [(272, 40, 4), (40, 136, 8), (129, 40, 4), (112, 40, 4), (40, 48, 8), (3, 3, 1)]
    for rows in range(1, launch_tc.MAX_ROWS + 1):
        for rb, kb, splits in cases:
            plan = launch_tc.ring_plan(rows, rb, kb, splits, sms)
            assert plan == (launch_tc.ring_stages(rows), launch_tc.ring_chunk(rows))
    monkeypatch.setenv("NINFER_KERNELS_ON", "fp8_fit_chunk")
    for rows in range(1, launch_tc.MAX_ROWS + 1):
        for rb, kb, splits in cases:
            stages, chunk = launch_tc.ring_plan(rows, rb, kb, splits, sms)
            assert stages == launch_tc.ring_stages(rows)
            assert 3 * _shared_per_block(rows, stages, chunk) <= launch_tc.SHARED_PER_SM
            split_kb = -(-kb // splits)
            default_chunk = launch_tc.ring_chunk(rows)
            assert -(-split_kb // chunk) <= -(-split_kb // default_chunk)  # no more stagings
    assert launch_tc.ring_plan(4, 272, 40, 4, sms) == (4, 10)  # gate-up at 4 rows: one staging
    monkeypatch.setenv("NINFER_KERNELS_ON", "fp8_four_per_sm")
    for rows in range(1, launch_tc.MAX_ROWS + 1):
        for rb, kb, splits in cases:
            stages, chunk = launch_tc.ring_plan(rows, rb, kb, splits, sms)
            if 3 * sms < rb * splits <= 4 * sms:
                assert 4 * _shared_per_block(rows, stages, chunk) <= launch_tc.SHARED_PER_SM
            else:
                assert (stages, chunk) == (launch_tc.ring_stages(rows), launch_tc.ring_chunk(rows))
    assert launch_tc.ring_plan(1, 112, 40, 4, sms) == (3, 10)  # qkv at 1 row: 448 blocks
    assert launch_tc.ring_plan(4, 112, 40, 4, sms) == (2, 10)  # at 4 rows: 3 stages stage twice
    assert launch_tc.ring_plan(1, 272, 40, 4, sms) == (4, 16)  # 1,088 blocks: untouched


def test_kernel_chunk_limit_matches_the_launcher() -> None:
    from pathlib import Path

    source = (Path(launch_tc.__file__).parent / "fp8_gemv.cu").read_text()
    assert f"kRingChunkMax = {launch_tc.FIT_CHUNK_MAX};" in source


def test_swiglu_input_declines_without_touching_cuda(monkeypatch) -> None:
    """The SwiGLU input form (every row count with `NINFER_KERNELS_ON=fp8_swiglu`), like the
    plain form, says no to CPU tensors before any device query."""
    monkeypatch.setenv("NINFER_KERNELS_ON", "fp8_swiglu")
    q, s = quantize_fp8_block(torch.randn(64, 256))
    weight = Fp8Weight(q, s)
    gate_up = torch.randn(1, 512, dtype=torch.bfloat16)
    assert not launch_tc.supports_swiglu(gate_up, weight)
    assert not launch_tc.swiglu_routed(gate_up, weight)
