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


def _stream_k_replay(w: np.ndarray, x: np.ndarray, ctas: int) -> tuple[np.ndarray, int]:
    """The stream-K kernel's partition replayed with numpy: block b's run of (row block, k block)
    tiles as the .cu computes it (b * T // P), its part of each row block it touches summed over
    its tiles, parts of a row block added in owner order by sk_owner's arithmetic. Returns the
    product and the most parts any row block had."""
    from ninfer.kernels.bf16_tc_gemv import launch

    rows, kb_width = launch.ROWS_PER_BLOCK, launch.K_PER_BLOCK
    n, k = w.shape
    row_blocks, k_blocks = -(-n // rows), -(-k // kb_width)
    tiles = row_blocks * k_blocks
    parts: dict[int, list[tuple[int, np.ndarray]]] = {}
    seen = np.zeros(tiles, dtype=int)
    for b in range(ctas):
        begin, end = b * tiles // ctas, (b + 1) * tiles // ctas
        acc = np.zeros((rows, x.shape[0]))
        for tile in range(begin, end):
            seen[tile] += 1
            assert launch.stream_k_owner(tile, tiles, ctas) == b
            rb, kb = divmod(tile, k_blocks)
            ks = slice(kb * kb_width, min(k, (kb + 1) * kb_width))
            block = np.zeros((rows, ks.stop - ks.start))
            block[: min(rows, n - rb * rows)] = w[rb * rows : (rb + 1) * rows, ks]
            acc += block @ x[:, ks].T
            if kb == k_blocks - 1 or tile == end - 1:  # the kernel's flush points
                parts.setdefault(rb, []).append((b, acc))
                acc = np.zeros((rows, x.shape[0]))
    assert (seen == 1).all()  # every tile in exactly one run
    out = np.zeros((n, x.shape[0]))
    most = 0
    for rb, held in parts.items():
        first = launch.stream_k_owner(rb * k_blocks, tiles, ctas)
        last = launch.stream_k_owner((rb + 1) * k_blocks - 1, tiles, ctas)
        assert [b for b, _ in held] == list(range(first, last + 1))  # part index = b - first
        most = max(most, len(held))
        total = sum(a for _, a in held)
        out[rb * rows : (rb + 1) * rows] = total[: min(rows, n - rb * rows)]
    return out.T, most


def test_stream_k_runs_cover_every_tile_once_and_sum_to_the_product() -> None:
    """N = 5,120-like shapes on a 132-SM grid of 3 blocks an SM, shapes off the 128-row and
    64-k grids, and grids larger than the tile count (the launcher clamps them: here one tile a
    block); the parts per row block never exceed what the launcher sizes the buffer for."""
    from ninfer.kernels.bf16_tc_gemv import launch

    rng = np.random.default_rng()
    for n, k, ctas in (
        (640, 2048, 396),
        (1000, 264, 7),
        (130, 4104, 13),
        (300, 64, 3),
        (256, 1024, 5),
        (5120 // 8, 6144 // 4, 396),
        (48, 64, 1),
    ):
        w = rng.standard_normal((n, k))
        x = rng.standard_normal((3, k))
        tiles = -(-n // launch.ROWS_PER_BLOCK) * -(-k // launch.K_PER_BLOCK)
        ctas = min(ctas, tiles)
        got, most = _stream_k_replay(w, x, ctas)
        np.testing.assert_allclose(got, x @ w.T, rtol=1e-10, atol=1e-9)
        row_blocks, k_blocks = -(-n // launch.ROWS_PER_BLOCK), -(-k // launch.K_PER_BLOCK)
        assert most == launch.stream_k_parts(row_blocks, k_blocks, ctas)


def test_stream_k_parts_at_the_27b_shapes() -> None:
    """The 27B's down and out_proj on 396 blocks (an H200 / H100 at 3 an SM): ~27 and ~10 tiles
    a block, so a row block is shared by about 11 blocks, never more than 12."""
    from ninfer.kernels.bf16_tc_gemv import launch

    assert launch.stream_k_parts(40, 272, 396) in (11, 12)
    assert launch.stream_k_parts(40, 96, 396) in (11, 12)
    assert launch.stream_k_parts(40, 96, 40) == 1  # a block a row block: stored as they stand
    assert launch.stream_k_owner(0, 3840, 396) == 0
    assert launch.stream_k_owner(3839, 3840, 396) == 395


def test_stream_k_grid_fits_its_ring() -> None:
    """3 blocks an SM at 4 stages (64 KiB), 2 at 6, 1 at 12 (192 KiB): as many as fit."""
    from ninfer.kernels.bf16_tc_gemv import launch

    assert [launch.stream_k_blocks_per_sm(s) for s in (2, 3, 4, 6, 12)] == [3, 3, 3, 2, 1]
    for stages in launch.SK_STAGES:
        fit = launch.stream_k_blocks_per_sm(stages)
        assert fit * (stages * 16 * 1024 + 1024) <= launch.SHARED_PER_SM


def test_stream_k_is_opt_in(monkeypatch) -> None:
    from ninfer.kernels.bf16_tc_gemv import launch

    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    assert not launch.stream_k_planned()
    monkeypatch.setenv("NINFER_KERNELS_ON", "tc_square,bf16_stream_k")
    assert launch.stream_k_planned()
    assert launch.stream_k_stages() == launch.DEFAULT_STAGES
    monkeypatch.setenv("NINFER_KERNELS_ON", "bf16_stream_k12")  # on, with a 12-stage ring
    assert launch.stream_k_planned() and launch.stream_k_stages() == 12
    monkeypatch.setenv("NINFER_KERNELS_ON", "bf16_stream_k6")
    assert launch.stream_k_planned() and launch.stream_k_stages() == 6
    monkeypatch.setenv("NINFER_KERNELS_ON", "bf16_tc_gemv")  # every shape on the kernel, not SK
    assert not launch.stream_k_planned()
