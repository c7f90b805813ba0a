"""The tensor-core bf16 skinny GEMM (`bf16_mma_gemv`) emulated on the CPU, its launch plan, its
launcher's operand checks and launch arguments, and dispatch's routing hook (off by default).

No GPU here, so the kernel is replayed block by block and lane by lane: the K split of each block,
the chunked x staging into the two shared buffers (only the M real rows and k below the split's
end are staged; everything else in a buffer is NaN, so a lane that reads it shows up), the ring
of weight loads (16 bytes of rows row0 + g and row0 + g + 8 per lane and step, zeros past K,
rows past N clamped), which words become which mma registers (support/mma_fragments.py writes
PTX's m16n8k16 layout out independently and multiplies in float64), the epilogue's stores or
fp32 partials, and the last-block reduction with atomicInc's wrap-around, blocks finishing in a
random order. Every output must be stored exactly once and equal x @ W^T in float64.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch
from ninfer.kernels import runtime as rt
from ninfer.kernels.bf16_mma_gemv import launch as mma
from ninfer.kernels.bf16_mma_gemv import reference as mma_ref
from support.mma_fragments import G, T, bits, ptx_accumulator, ptx_tiles, words

CHUNK, PAD = mma.CHUNK, mma.PAD
STRIDE = CHUNK + PAD
NAN_BITS = 0x7FC0


def stage_chunk(buf: np.ndarray, xb: np.ndarray, m: int, kc: int, ke: int) -> None:
    """bmg::stage_chunk: piece (row, j) = 8 bf16 of x row `row` at kc + 8 j, rows < m and k < ke
    only. The buffer is NaN first: whatever the kernel does not stage counts as garbage."""
    buf[:] = NAN_BITS
    for row in range(m):
        for j in range(CHUNK // 8):
            col = kc + 8 * j
            if col < ke:
                buf[row, 8 * j : 8 * j + 8] = xb[row, col : col + 8]


def step_registers(
    wb: np.ndarray, buf: np.ndarray, row0: int, kb: int, ke: int, s: int, u: int, nt: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(a [32, 4], b [32, 2]) of step s's two mma for the m-tile at row0 and n-tile nt: lane
    (g, t) has elements kb + 32 s + 8 t .. + 7 of weight rows row0 + g, row0 + g + 8 (clamped
    to N - 1) from global memory and of staged row 8 nt + g at 32 u + 8 t from the buffer; both
    zero where kb + 32 s + 8 t >= ke. mma h takes words 2h, 2h + 1 (a0 = w, a1 = v, a2 = w',
    a3 = v'; b0 = x, b1 = x')."""
    n = wb.shape[0]
    ok = (32 * s < ke - kb - 8 * T)[:, None]
    col = kb + 32 * s + 8 * T
    cols = np.minimum(col, wb.shape[1] - 8)[:, None] + np.arange(8)  # any address when not ok
    w = np.where(ok, words(wb[np.minimum(row0 + G, n - 1)[:, None], cols]), 0)
    v = np.where(ok, words(wb[np.minimum(row0 + G + 8, n - 1)[:, None], cols]), 0)
    scol = (32 * u + 8 * T)[:, None] + np.arange(8)
    x = np.where(ok, words(buf[(8 * nt + G)[:, None], scol]), 0)
    return [
        (
            np.stack([w[:, 2 * h], v[:, 2 * h], w[:, 2 * h + 1], v[:, 2 * h + 1]], axis=1),
            np.stack([x[:, 2 * h], x[:, 2 * h + 1]], axis=1),
        )
        for h in range(2)
    ]


def run_block(
    wb: np.ndarray, xb: np.ndarray, m: int, p: mma.Plan, tile: int, split: int
) -> dict[int, np.ndarray]:
    """One block's accumulators: {warp m-tile row0: [NT, 32, 4]} for the warps that own rows."""
    n, k = wb.shape
    kb = split * p.split_chunks * CHUNK
    ke = min(kb + p.split_chunks * CHUNK, k)
    steps = -(-(ke - kb) // 32)
    chunks = -(-(ke - kb) // CHUNK)
    bufs = np.full((2, 8 * p.n_tiles, STRIDE), NAN_BITS, dtype=np.uint16)
    acc: dict[int, np.ndarray] = {}
    for warp in range(mma.WARPS):
        warp_row0 = tile * p.rows_per_block + warp * 16 * p.m_tiles
        if warp_row0 < n:
            for i in range(p.m_tiles):
                acc[warp_row0 + 16 * i] = np.zeros((p.n_tiles, 16, 8))
    for c in range(chunks):
        buf = bufs[c & 1]
        stage_chunk(buf, xb, m, kb + c * CHUNK, ke)
        for u in range(CHUNK // 32):
            s = c * (CHUNK // 32) + u
            if s >= steps:
                break
            for row0, d in acc.items():
                for nt in range(p.n_tiles):
                    for a, b in step_registers(wb, buf, row0, kb, ke, s, u, nt):
                        tile_a, tile_b = ptx_tiles(a, b)
                        d[nt] += tile_a @ tile_b
    return {
        row0: np.stack([ptx_accumulator(d[nt]) for nt in range(p.n_tiles)])
        for row0, d in acc.items()
    }


def fragment_stores(regs: dict[int, np.ndarray], m: int, n: int):
    """The epilogue's (x row, output row, value) stores: c0, c1 -> row row0 + g of x rows
    8 nt + 2 t, + 1; c2, c3 -> row + 8; x rows >= m and output rows >= n are not stored."""
    for row0, c in regs.items():
        for nt in range(c.shape[0]):
            for lane in range(32):
                for e in range(2):
                    mm = 8 * nt + 2 * T[lane] + e
                    if mm >= m:
                        continue
                    row = row0 + G[lane]
                    if row < n:
                        yield mm, row, c[nt, lane, e]
                    if row + 8 < n:
                        yield mm, row + 8, c[nt, lane, 2 + e]


def emulate(x: torch.Tensor, w: torch.Tensor, p: mma.Plan, seed: int = 0) -> np.ndarray:
    """The kernel's [M, N] result before the bf16 rounding (float64; NaN where nothing stored),
    checking that every output (and, split, every partial) is stored exactly once, that exactly
    one block per row tile reduces, and that the counters end at zero."""
    m = x.shape[0]
    n, _ = w.shape
    wb, xb = bits(w), bits(x)
    out = np.full((m, n), np.nan)
    stores = np.zeros((m, n), dtype=int)
    partial = np.full((p.splits, m, n), np.nan)
    partial_stores = np.zeros((p.splits, m, n), dtype=int)
    counters = np.zeros(p.tiles, dtype=np.int64)
    blocks = [(b, z) for b in range(p.tiles) for z in range(p.splits)]
    order = np.random.default_rng(seed).permutation(len(blocks))  # the order blocks finish in
    reducers = []
    for i in order:
        tile, split = blocks[i]
        regs = run_block(wb, xb, m, p, tile, split)
        for mm, row, value in fragment_stores(regs, m, n):
            if p.splits == 1:
                out[mm, row] = value
                stores[mm, row] += 1
            else:
                partial[split, mm, row] = value
                partial_stores[split, mm, row] += 1
        if p.splits == 1:
            continue
        old = counters[tile]  # atomicInc(counter, splits - 1)
        counters[tile] = 0 if old >= p.splits - 1 else old + 1
        if old != p.splits - 1:
            continue
        reducers.append(tile)
        row0 = tile * p.rows_per_block
        rows = min(p.rows_per_block, n - row0)
        for mm in range(m):
            for row in range(row0, row0 + rows):
                out[mm, row] = sum(partial[z, mm, row] for z in range(p.splits))  # split order
                stores[mm, row] += 1
    assert (stores == 1).all(), "an output stored other than once"
    if p.splits > 1:
        assert (partial_stores == 1).all(), "a partial stored other than once"
        assert sorted(reducers) == list(range(p.tiles)) and not counters.any()
    return out


def operands(m: int, n: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) / k**0.5).to(torch.bfloat16)
    return x, w


CASES = [
    # m, n, k, num_sms, (m_tiles, depth)
    pytest.param(13, 40, 200, 132, (1, 4), id="m13-n40-k200"),  # one tile, K off the chunk
    pytest.param(64, 136, 264, 132, (1, 4), id="m64-two-tiles"),
    pytest.param(9, 150, 1032, 132, (1, 2), id="m9-split-k-off-chunk"),
    pytest.param(33, 70, 1544, 132, (2, 2), id="m33-mt2-split"),
    pytest.param(24, 300, 520, 4, (2, 4), id="m24-mt2-two-tiles"),
    pytest.param(5, 17, 8, 132, (1, 4), id="m5-one-piece"),
    pytest.param(48, 16, 2048, 132, (1, 4), id="m48-split4"),
]


@pytest.mark.parametrize("m,n,k,num_sms,variant", CASES)
def test_lane_fragments_compute_x_times_w_transposed(m, n, k, num_sms, variant) -> None:
    """Every output equals x @ W^T in float64 (bf16 products and their sums are exact there),
    through the plan the launcher would make; against fp32 matmul and, rounded, F.linear."""
    x, w = operands(m, n, k, seed=1000 * m + n + k)
    p = mma.plan(m, n, k, num_sms, m_tiles=variant[0], depth=variant[1])
    got = emulate(x, w, p, seed=k)
    want = (x.double() @ w.double().T).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, (x.float() @ w.float().T).numpy(), rtol=1e-5, atol=1e-5)
    twin = mma_ref.bf16_linear(x, w).float()
    rounded = torch.from_numpy(got).to(torch.bfloat16).float()
    assert ((rounded - twin).norm() / twin.norm()).item() < 1e-2


def test_the_cases_cover_the_edges() -> None:
    """The emulated cases include: M not a multiple of 8, N not a multiple of the block's rows,
    K not a multiple of the chunk (nor of 32), split and unsplit launches, both m-tile counts."""
    plans = []
    for case in CASES:
        m, n, k, sms, (mt, d) = case.values
        plans.append((m, n, k, mma.plan(m, n, k, sms, m_tiles=mt, depth=d)))
    assert any(m % 8 for m, _, _, _ in plans)
    assert any(n % p.rows_per_block for _, n, _, p in plans)
    assert any(k % CHUNK and k % 32 for _, _, k, _ in plans)
    assert any(p.splits > 1 and k % CHUNK for _, _, k, p in plans)  # a short last split
    assert {p.splits > 1 for *_, p in plans} == {True, False}
    assert {p.m_tiles for *_, p in plans} == {1, 2}
    assert any(p.tiles > 1 and p.splits > 1 for *_, p in plans)


def test_fragment_layout_fills_each_slot_once() -> None:
    """support/mma_fragments.py's layout: the 32 lanes' registers fill every slot of A and B
    exactly once (so a NaN left in a tile would be a slot no register fills)."""
    halves = (0x3F80 + np.arange(256 + 128)).astype(np.uint16)  # 384 distinct finite bf16
    a = words(halves[:256].reshape(32, 8))  # [32, 4]
    b = words(halves[256:].reshape(32, 4))  # [32, 2]
    tile_a, tile_b = ptx_tiles(a, b)
    assert not np.isnan(tile_a).any() and not np.isnan(tile_b).any()
    assert len(np.unique(tile_a)) == 256 and len(np.unique(tile_b)) == 128


def test_each_mma_pair_takes_every_k_of_a_step_once() -> None:
    """mma h, slot 2t + e is k 8t + 4h + e, slot 2t + 8 + e is k 8t + 4h + 2 + e: over both mma
    the 32 k of a step, once each, for A and B alike."""
    seen = []
    for h in range(2):
        slots = {}
        for t in range(4):
            for e in range(2):
                slots[2 * t + e] = 8 * t + 4 * h + e
                slots[2 * t + 8 + e] = 8 * t + 4 * h + 2 + e
        assert sorted(slots) == list(range(16))
        seen += slots.values()
    assert sorted(seen) == list(range(32))


def test_staged_rows_are_read_without_bank_conflicts() -> None:
    """A quarter-warp's 16-byte shared loads (lanes 8q .. 8q + 7: staged rows 2q, 2q + 1 of an
    n-tile, t = 0..3) touch 32 distinct banks in every step of a chunk, thanks to the pad."""
    stride = STRIDE * 2  # bytes
    for nt in range(8):
        for u in range(CHUNK // 32):
            for q in range(4):
                banks = []
                for lane in range(8 * q, 8 * q + 8):
                    g, t = lane >> 2, lane & 3
                    addr = (8 * nt + g) * stride + (32 * u + 8 * t) * 2
                    banks += [(addr // 4 + i) % 32 for i in range(4)]
                assert sorted(banks) == list(range(32))


# --- the launch plan --------------------------------------------------------------------------

PLAN_SHAPES = [
    (34816, 5120),
    (5120, 17408),
    (16480, 5120),
    (14336, 5120),
    (5120, 6144),
    (248320, 5120),
    (12352, 2048),
    (9216, 2048),
    (2048, 4096),
    (1, 8),
    (37, 40),
    (1003, 520),
    (129, 1032),
]


@pytest.mark.parametrize("variant", mma.VARIANTS)
@pytest.mark.parametrize("num_sms", [132, 8])
@pytest.mark.parametrize("n,k", PLAN_SHAPES)
@pytest.mark.parametrize("rows", [1, 4, 8, 9, 16, 24, 33, 48, 64])
def test_plan_covers_every_output_once(rows, n, k, num_sms, variant) -> None:
    """Row tiles cover [0, N) once (the last one starts inside it); the splits cover [0, K)
    once with none empty; the grid fits one wave when split; the buffers fit 48 KiB."""
    m_tiles, depth = variant
    p = mma.plan(rows, n, k, num_sms, m_tiles=m_tiles, depth=depth)
    assert p.n_tiles == -(-rows // 8) and 8 * p.n_tiles >= rows
    assert p.rows_per_block == 128 * m_tiles
    assert (p.tiles - 1) * p.rows_per_block < n <= p.tiles * p.rows_per_block
    span = p.split_chunks * CHUNK
    assert (p.splits - 1) * span < k <= p.splits * span
    slots = num_sms * mma.BLOCKS_PER_SM[m_tiles]
    if p.splits > 1:
        assert p.tiles * p.splits <= slots
        assert p.split_chunks >= mma.MIN_SPLIT_CHUNKS
    assert p.shared_mem <= 48 * 1024
    # every (row, k) lands in exactly one block: count over blocks
    cover = np.zeros(p.tiles * p.rows_per_block, dtype=int)
    for b in range(p.tiles):
        cover[b * p.rows_per_block : (b + 1) * p.rows_per_block] += 1
    assert (cover[:n] == 1).all()
    kcover = np.zeros(p.splits * span, dtype=int)
    for z in range(p.splits):
        kb = z * span
        kcover[kb : min(kb + span, k)] += 1
    assert (kcover[:k] == 1).all()


def test_plan_of_the_27b_shapes() -> None:
    """On 132 SMs with the default variant (MT = 1, 2 blocks per SM: 264 slots)."""
    want = {
        (34816, 5120): (272, 1),
        (16480, 5120): (129, 2),
        (14336, 5120): (112, 2),
        (5120, 6144): (40, 6),
        (5120, 17408): (40, 6),
        (12352, 2048): (97, 2),
        (9216, 2048): (72, 3),
        (2048, 4096): (16, 8),
    }
    for (n, k), (tiles, splits) in want.items():
        p = mma.plan(64, n, k, 132)
        assert (p.tiles, p.splits) == (tiles, splits), (n, k)
        assert p.instance == "bf16_mma_gemv<8, 1, 4>" and p.shared_mem == 40960
    assert mma.plan(9, 5120, 17408, 132).split_chunks == 23  # 136 chunks: 5 x 23 + 21
    with pytest.raises(rt.KernelInputError, match="not one of"):
        mma.plan(16, 5120, 5120, 132, m_tiles=2, depth=1)
    with pytest.raises(rt.KernelInputError, match="no plan"):
        mma.plan(65, 5120, 5120, 132)


def test_source_constants_match_the_launcher() -> None:
    """The .cu's chunk, pad, warp count and launch bounds are the ones the plan assumes, and every
    variant's depth divides a chunk's steps (the ring slot is a compile-time index)."""
    source = (rt.KERNEL_DIR / "bf16_mma_gemv" / "bf16_mma_gemv.cu").read_text()
    assert f"constexpr int kWarps = {mma.WARPS};" in source
    assert re.search(rf"constexpr int kChunk = {CHUNK};", source)
    assert re.search(rf"constexpr int kPad = {PAD};", source)
    assert "__launch_bounds__(256, MT == 1 ? 2 : 1)" in source
    assert mma.BLOCKS_PER_SM == {1: 2, 2: 1}
    assert all((CHUNK // 32) % depth == 0 for _, depth in mma.VARIANTS)
    assert (mma.M_TILES, mma.DEPTH) in mma.VARIANTS


# --- the launcher, with the CUDA runtime mocked ---------------------------------------------------


class Launches:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, num_sms: int = 132) -> None:
        self.calls: list[dict[str, Any]] = []
        monkeypatch.setattr(rt, "check_cuda", lambda *t: torch.device("cpu"))
        monkeypatch.setattr(rt, "get_kernel", lambda op, instance, device: instance)
        monkeypatch.setattr(rt, "launch", self.launch)
        monkeypatch.setattr(mma, "_problem", lambda x, w: None)
        monkeypatch.setattr(rt, "num_sms", lambda device: num_sms)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(mma, "_counters", {})

    def launch(self, kernel, grid, block, args, device, *, shared_mem: int = 0) -> None:
        self.calls.append(
            {"instance": kernel, "grid": grid, "block": block, "args": args, "smem": shared_mem}
        )


def test_launch_arguments(monkeypatch) -> None:
    """Unsplit: no partials or counters (NULL); split: fp32 partials and the zeroed counters."""
    launches = Launches(monkeypatch)
    bf16 = torch.bfloat16
    x = torch.zeros(64, 5120, dtype=bf16)
    out = mma.bf16_linear(x, torch.zeros(34816, 5120, dtype=bf16))
    assert out.shape == (64, 34816) and out.dtype == bf16
    mma.bf16_linear(x[:33], torch.zeros(5120, 5120, dtype=bf16))
    mma.bf16_linear(x[:16, :2048], torch.zeros(12352, 2048, dtype=bf16), m_tiles=2, depth=2)
    gate_up, o_proj, in_proj = launches.calls
    assert gate_up["instance"] == "bf16_mma_gemv<8, 1, 4>"
    assert gate_up["grid"] == (272, 1) and gate_up["block"] == (256,)
    assert gate_up["smem"] == 40960
    assert gate_up["args"][1] == 0 and gate_up["args"][2] == 0  # no partials, no counters
    assert int(gate_up["args"][4]) == 5120  # x row stride
    assert [int(a) for a in gate_up["args"][6:]] == [64, 34816, 5120, 40]  # m, n, k, chunks
    assert o_proj["instance"] == "bf16_mma_gemv<5, 1, 4>" and o_proj["grid"] == (40, 6)
    assert o_proj["args"][1] != 0 and o_proj["args"][2] != 0
    assert int(o_proj["args"][-1]) == 7  # 40 chunks in 6 splits of 7 (the last 5)
    counters = mma._counters[torch.device("cpu")]
    assert counters.dtype == torch.int32 and counters.numel() >= 40 and not counters.any()
    assert in_proj["instance"] == "bf16_mma_gemv<2, 2, 2>" and in_proj["grid"] == (49, 2)
    assert in_proj["smem"] == 2 * 16 * 160 * 2
    with pytest.raises(rt.KernelInputError, match="not one of"):
        mma.bf16_linear(x, torch.zeros(64, 5120, dtype=bf16), depth=3)


def test_problem_rejects_bad_operands() -> None:
    """The operand checks come before the device check, so their messages show on the CPU."""
    bf16 = torch.bfloat16
    problem = mma._problem
    x = torch.randn(24, 64).to(bf16)
    w = torch.randn(40, 64).to(bf16)
    assert "2-D" in problem(x[None], w)
    assert "bfloat16" in problem(x.float(), w)
    assert "bfloat16" in problem(x, w.half())
    assert "1..64" in problem(torch.randn(65, 64).to(bf16), w)
    assert "1..64" in problem(torch.randn(0, 64).to(bf16), w)
    assert "does not match" in problem(x, w[:, :32])
    assert "multiple of 8" in problem(torch.randn(2, 12).to(bf16), torch.randn(4, 12).to(bf16))
    assert "dense" in problem(torch.randn(64, 24).to(bf16).T, w)  # column-major x
    wide = torch.randn(24, 68).to(bf16)
    assert "row stride" in problem(wide[:, :64], w)  # 136-byte rows
    assert "contiguous" in problem(x, torch.randn(64, 40).to(bf16).T)
    assert "CUDA" in problem(x, w)  # well-formed, but on the CPU
    assert not mma.supports(x, w)
    with pytest.raises(rt.KernelInputError, match="CUDA device"):
        mma.bf16_linear(x, w)


# --- dispatch's routing hook ------------------------------------------------------------------


def test_routing_is_off_by_default() -> None:
    assert mma.ROUTE_ROWS is None
    for rows in (1, 9, 16, 24, 32, 48, 64):
        assert not mma.mma_preferred(rows, 34816, 5120)


def test_cpu_dispatch_is_still_f_linear() -> None:
    x, w = operands(24, 40, 64, seed=3)
    assert not dispatch.bf16_mma_routed(x, w)
    assert torch.equal(dispatch.linear(x, w), F.linear(x, w))
    assert torch.equal(mma_ref.bf16_linear(x, w), F.linear(x, w))


def stub_device(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Device checks stubbed as on a GPU; returns the list the stubbed kernel records calls in."""
    monkeypatch.setattr(
        dispatch, "use_cuda_kernels", lambda t, op=None: not dispatch.switched_off(op)
    )
    monkeypatch.setattr(mma, "supports", lambda x, w: True)
    monkeypatch.setattr(dispatch._bf16_gemv_cuda, "supports", lambda x, w, **kw: True)
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    calls: list[tuple[int, int]] = []

    def kernel(x, w):
        calls.append((x.shape[0], w.shape[0]))
        return torch.zeros(x.shape[0], w.shape[0], dtype=x.dtype)

    monkeypatch.setattr(mma, "bf16_linear", kernel)
    return calls


def test_hook_routes_nothing_while_the_constant_is_unset(monkeypatch) -> None:
    """With the device checks stubbed (as on a GPU), every shape and row count still takes the
    path it took before the kernel existed."""
    calls = stub_device(monkeypatch)
    bf16 = torch.bfloat16
    for n, k in ((34816, 512), (5120, 612 * 8), (2048, 4096)):
        w = torch.zeros(n, k, dtype=bf16)
        for rows in (9, 16, 33, 64):
            assert not dispatch.bf16_mma_routed(torch.zeros(rows, k, dtype=bf16), w)
            dispatch.linear(torch.zeros(rows, k, dtype=bf16), w)
    assert calls == []


def test_hook_routes_where_the_constants_allow(monkeypatch) -> None:
    calls = stub_device(monkeypatch)
    monkeypatch.setattr(mma, "ROUTE_ROWS", (9, 64))
    bf16 = torch.bfloat16
    gate_up = torch.zeros(34816, 128, dtype=bf16)  # K kept small: the stubs never read it
    for rows in (9, 16, 24, 33, 64):
        assert dispatch.bf16_mma_routed(torch.zeros(rows, 128, dtype=bf16), gate_up)
    assert not dispatch.bf16_mma_routed(torch.zeros(8, 128, dtype=bf16), gate_up)
    assert not dispatch.bf16_mma_routed(torch.zeros(65, 128, dtype=bf16), gate_up)
    assert not dispatch.bf16_mma_routed(torch.zeros(16, 128), gate_up.float())
    assert not dispatch.bf16_mma_routed(torch.zeros(1, 16, 128, dtype=bf16), gate_up)
    dispatch.linear(torch.zeros(16, 128, dtype=bf16), gate_up)
    assert calls == [(16, 34816)]
    # fewer rows keep their old path: the bf16 GEMV where it is preferred, else F.linear
    small = torch.zeros(2048, 512, dtype=bf16)
    gemv_calls: list[int] = []
    monkeypatch.setattr(
        dispatch._bf16_gemv_cuda,
        "bf16_linear",
        lambda x, w: gemv_calls.append(x.shape[0]) or torch.zeros(x.shape[0], w.shape[0]),
    )
    dispatch.linear(torch.zeros(4, 512, dtype=bf16), small)
    assert gemv_calls == [4] and calls == [(16, 34816)]
    # the other knobs: a weight-count floor and a shape list
    monkeypatch.setattr(mma, "ROUTE_MIN_WEIGHTS", 34816 * 128 + 1)
    assert not dispatch.bf16_mma_routed(torch.zeros(16, 128, dtype=bf16), gate_up)
    monkeypatch.setattr(mma, "ROUTE_MIN_WEIGHTS", 0)
    monkeypatch.setattr(mma, "ROUTE_SHAPES", frozenset({(5120, 128)}))
    assert not dispatch.bf16_mma_routed(torch.zeros(16, 128, dtype=bf16), gate_up)
    assert dispatch.bf16_mma_routed(
        torch.zeros(16, 128, dtype=bf16), torch.zeros(5120, 128, dtype=bf16)
    )
    # the kill switch, and that it does not touch the bf16 GEMV's (nor the reverse)
    monkeypatch.setattr(mma, "ROUTE_SHAPES", None)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "bf16_mma_gemv")
    assert not dispatch.bf16_mma_routed(torch.zeros(16, 128, dtype=bf16), gate_up)
    assert dispatch.bf16_gemv_routed(torch.zeros(4, 512, dtype=bf16), small)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "bf16_gemv")
    assert dispatch.bf16_mma_routed(torch.zeros(16, 128, dtype=bf16), gate_up)
    assert not dispatch.bf16_gemv_routed(torch.zeros(4, 512, dtype=bf16), small)
