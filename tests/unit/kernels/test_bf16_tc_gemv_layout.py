"""The tensor-core bf16 GEMV's lane mapping (bf16_tc_gemv.cu), replayed on the CPU.

One warp, one 64-wide k block: each lane (g, t) takes the 16-byte pieces the kernel copies
(k [8t, 8t + 8) and [32 + 8t, 40 + 8t) of weight rows g and g + 8, the same k of x row g), forms
the four mma's A and B registers from them as the kernel does, and the mma is applied with the
PTX ISA's m16n8k16 fragment layout (A: a0 = row g, k slots 2t, 2t + 1; a1 = row g + 8, same
slots; a2 = row g, slots 2t + 8, 2t + 9; a3 = row g + 8, those slots. B: b0 = slots 2t, 2t + 1,
column g; b1 = slots 2t + 8, 2t + 9. D: d0, d1 = row g, columns 2t, 2t + 1; d2, d3 = row
g + 8). The result must be the plain product W @ x.T of the block, which holds only if every k
of the block lands in exactly one slot of one mma, the same for A and B.
"""

from __future__ import annotations

import numpy as np


def _words(row: np.ndarray, start: int) -> list[tuple[float, float]]:
    """The four 32-bit words of the 16-byte piece at element `start`: bf16 pairs (lo, hi)."""
    return [(row[start + 2 * i], row[start + 2 * i + 1]) for i in range(4)]


def _warp_product(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """What one warp's four mma accumulate for a 16 x 64 weight tile and 8 x 64 x rows."""
    d = np.zeros((16, 8))
    regs = {}
    for g in range(8):
        for t in range(4):
            lane = {}
            for piece, base in enumerate((8 * t, 32 + 8 * t)):
                lane[("g", piece)] = _words(w[g], base)
                lane[("g8", piece)] = _words(w[g + 8], base)
                lane[("x", piece)] = _words(x[g], base)
            regs[(g, t)] = lane
    for piece in range(2):
        for h in range(2):  # mma h of the piece: words 2h, 2h + 1
            a = np.zeros((16, 16))
            b = np.zeros((16, 8))
            for g in range(8):
                for t in range(4):
                    lane = regs[(g, t)]
                    a0, a2 = lane[("g", piece)][2 * h], lane[("g", piece)][2 * h + 1]
                    a1, a3 = lane[("g8", piece)][2 * h], lane[("g8", piece)][2 * h + 1]
                    b0, b1 = lane[("x", piece)][2 * h], lane[("x", piece)][2 * h + 1]
                    a[g, 2 * t : 2 * t + 2] = a0
                    a[g + 8, 2 * t : 2 * t + 2] = a1
                    a[g, 2 * t + 8 : 2 * t + 10] = a2
                    a[g + 8, 2 * t + 8 : 2 * t + 10] = a3
                    b[2 * t : 2 * t + 2, g] = b0
                    b[2 * t + 8 : 2 * t + 10, g] = b1
            d += a @ b
    return d


def test_lane_mapping_gives_the_tile_product() -> None:
    rng = np.random.default_rng()
    w = rng.standard_normal((16, 64))
    x = rng.standard_normal((8, 64))
    np.testing.assert_allclose(_warp_product(w, x), w @ x.T, rtol=1e-12, atol=1e-12)


def test_a_k_left_out_or_doubled_would_show() -> None:
    """The replay is sensitive to the mapping: a single k's weight changes the product."""
    rng = np.random.default_rng()
    w = rng.standard_normal((16, 64))
    x = rng.standard_normal((8, 64))
    for k in (0, 7, 31, 32, 63):
        bumped = w.copy()
        bumped[3, k] += 1.0
        diff = _warp_product(bumped, x) - _warp_product(w, x)
        np.testing.assert_allclose(diff[3], x[:, k], atol=1e-12)
        assert np.abs(np.delete(diff, 3, axis=0)).max() < 1e-12


def test_routing_rule_takes_long_rows_of_two_to_eight_x_rows(monkeypatch) -> None:
    from ninfer.kernels.bf16_tc_gemv import launch

    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    assert launch.tc_preferred(4, 5120, 17408)  # the 27B down projection
    assert not launch.tc_preferred(1, 5120, 17408)  # one row: the fused CUDA-core GEMV
    assert not launch.tc_preferred(9, 5120, 17408)  # past the mma's 8 columns
    assert not launch.tc_preferred(8, 34816, 5120)  # wide: cuBLAS
    assert launch.tc_preferred(8, 5120, 6144) and launch.tc_preferred(2, 5120, 6144)  # out_proj
    assert not launch.tc_preferred(1, 5120, 6144)
    assert not launch.tc_preferred(8, 2048, 4096)  # the 35B-A3B's: too few row blocks
    assert launch.tc_preferred(8, 2048, 6144)  # but long rows at any N
    monkeypatch.setenv("NINFER_KERNELS_OFF", "tc_square")
    assert not launch.tc_preferred(8, 5120, 6144) and launch.tc_preferred(4, 5120, 17408)
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    monkeypatch.setenv("NINFER_KERNELS_ON", "bf16_tc_gemv")
    assert launch.tc_preferred(1, 34816, 5120)


def test_ring_depth_switches_pick_a_compiled_depth(monkeypatch) -> None:
    from ninfer.kernels.bf16_tc_gemv import launch

    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    assert launch.planned_stages() == launch.DEFAULT_STAGES == 4
    for stages, name in launch.STAGE_SWITCHES.items():
        monkeypatch.setenv("NINFER_KERNELS_ON", f"gemv_rows8,{name}")
        assert launch.planned_stages() == stages and stages in launch.STAGES
    monkeypatch.setenv("NINFER_KERNELS_ON", "tc_square")  # an unrelated name keeps the default
    assert launch.planned_stages() == launch.DEFAULT_STAGES
