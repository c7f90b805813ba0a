"""The tensor-core int4 kernel (`int4_mma`, int4_gemv.cu) emulated lane by lane on the CPU.

No GPU here, so every claim the kernel rests on is replayed in numpy from constants read out of
the .cu source: the nibble -> bf16 decode (lop3 mask and or-constant, the bf16x2 fma by 1 and
-136), the pairs of nibbles each A register takes (the a[i][j] = nibble_pair<P>(...) lines), the
staging permutation of x (the four prmt selectors), the chunked shared-memory layout (KC = 32 / NT
groups, KC * 64 + 8 bf16 per row), each lane's loads (8 bytes at 32 kg + 8t of rows g and g + 8,
clamped past R), the PTX fragment layout of mma.m16n8k16 (A row g / g + 8, cols 2t + e /
2t + 8 + e; B rows 2t + e / 2t + 8 + e, col g; C (g, 2t + e), (g + 8, 2t + e)), the per-group
fixup and the stores (x rows < M, weight rows < R). The emulation runs in float64 and must equal
`reference.int4_linear` to fp32 rounding and the exact fp64 product to 1e-12.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from ninfer.kernels import runtime
from ninfer.kernels.int4_gemv import launch as int4_cuda
from ninfer.kernels.int4_gemv import reference as int4_ref

SOURCE = (runtime.KERNEL_DIR / "int4_gemv" / "int4_gemv.cu").read_text()
MMA_SOURCE = SOURCE[SOURCE.index("namespace int4mma") :]


def _bf16_bits_to_f64(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32).astype(np.float64)


def _f64_to_bf16_bits(v: np.ndarray) -> np.ndarray:
    """Exact values only (the test asserts the round trip)."""
    bits = (v.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    assert np.array_equal(_bf16_bits_to_f64(bits), v)
    return bits


def _halves(word: int) -> tuple[float, float]:
    w = np.array([word & 0xFFFF, word >> 16], dtype=np.uint16)
    lo, hi = _bf16_bits_to_f64(w)
    return float(lo), float(hi)


def _constants() -> dict[str, int]:
    m = re.search(
        r'lop3\.b32 %0, %1, %2, %3, (0x[0-9a-f]+);" : "=r"\(v\) : "r"\(w >> \(4 \* P\)\), '
        r'"r"\((0x[0-9a-f]+)u\),\s*"r"\((0x[0-9a-f]+)u\)',
        MMA_SOURCE,
    )
    f = re.search(
        r'fma\.rn\.bf16x2 %0, %1, %2, %3;" : "=r"\(q\) : "r"\(v\), "r"\((0x[0-9a-f]+)u\), '
        r'"r"\((0x[0-9a-f]+)u\)',
        MMA_SOURCE,
    )
    assert m and f, "nibble_pair's constants not found in int4_gemv.cu"
    return {
        "lut": int(m[1], 16),
        "mask": int(m[2], 16),
        "or": int(m[3], 16),
        "mul": int(f[1], 16),
        "add": int(f[2], 16),
    }


def _lop3(a: int, b: int, c: int, lut: int) -> int:
    out = 0
    for bit in range(32):
        idx = (((a >> bit) & 1) << 2) | (((b >> bit) & 1) << 1) | ((c >> bit) & 1)
        out |= ((lut >> idx) & 1) << bit
    return out


def _nibble_pair(word: int, pair: int, k: dict[str, int]) -> int:
    """nibble_pair<P>: the lop3, then fma.rn.bf16x2 (exact here: small integers)."""
    v = _lop3(word >> (4 * pair), k["mask"], k["or"], k["lut"])
    out = 0
    for half in range(2):
        a = _halves(v)[half]
        mul = _halves(k["mul"])[half]
        add = _halves(k["add"])[half]
        r = np.array([a * mul + add])
        out |= int(_f64_to_bf16_bits(r)[0]) << (16 * half)
    return out


def _a_lines() -> list[tuple[int, int, int, str]]:
    """compute_group's a[2u + di][j] = nibble_pair<P>(wg or wg8[u]) lines: (di, j, P, src)."""
    lines = re.findall(
        r"a\[2 \* u( \+ 1)?\]\[(\d)\] = nibble_pair<(\d)>\((wg8?)\[u\]\);", MMA_SOURCE
    )
    assert len(lines) == 8
    return [(1 if d else 0, int(j), int(p), src) for d, j, p, src in lines]


def _prmt(a: int, b: int, sel: int) -> int:
    src = a | (b << 32)
    out = 0
    for pos in range(4):
        out |= ((src >> (8 * ((sel >> (4 * pos)) & 7))) & 0xFF) << (8 * pos)
    return out


def _stage_lines() -> list[tuple[int, str, str, str]]:
    """stage_x's prmt lines: (selector, out word, first word, second word)."""
    lines = re.findall(
        r'prmt\.b32 %0, %1, %2, (0x[0-9a-f]+);" : "=r"\(o\.(\w)\) : "r"\(u\.(\w)\), '
        r'"r"\(u\.(\w)\)',
        MMA_SOURCE,
    )
    assert len(lines) == 4
    return [(int(s, 16), o, a, b) for s, o, a, b in lines]


def test_nibble_decode_is_exact_for_all_bytes() -> None:
    k = _constants()
    lines = {(p, src) for _, _, p, src in _a_lines()}
    assert {p for p, _ in lines} == {0, 1, 2, 3}
    rng = np.random.default_rng(0)
    for _ in range(200):
        word = int(rng.integers(0, 2**32))
        nibbles = [(word >> (4 * j)) & 0xF for j in range(8)]
        for pair in range(4):
            lo, hi = _halves(_nibble_pair(word, pair, k))
            assert (lo, hi) == (nibbles[pair] - 8, nibbles[pair + 4] - 8)
    for n in range(16):  # every nibble value in both halves
        word = n | (n << 16)
        assert _halves(_nibble_pair(word, 0, k)) == (n - 8, n - 8)


def _emulate(x: np.ndarray, packed: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """int4_mma<NT, D> for bf16 x [M, H] (as float64), packed [R, H/2] uint8, scale [R, G]."""
    k = _constants()
    a_lines = _a_lines()
    stage = _stage_lines()
    m_rows, hidden = x.shape
    rows = packed.shape[0]
    groups = hidden // 64
    nt_count = -(-m_rows // 8)
    assert re.search(r"constexpr int KC = 32 / NT;", MMA_SOURCE)
    assert re.search(r"constexpr int kRow = KC \* 64 \+ 8;", MMA_SOURCE)
    kc_groups = 32 // nt_count
    k_row = kc_groups * 64 + 8
    x_bits = _f64_to_bf16_bits(x.reshape(-1)).reshape(x.shape).astype(np.uint32)
    words = packed.view("<u4").astype(np.int64)  # [R, H / 8]
    out = np.full((m_rows, rows), np.nan)
    for block in range(-(-rows // 128)):
        xs = np.zeros(8 * nt_count * k_row, dtype=np.uint16)
        acc = np.zeros((8, 32, nt_count, 4))  # [warp, lane, n-tile, c]
        for kc in range(groups):
            kl = kc % kc_groups
            if kl == 0:  # stage_x: 8 values per thread, permuted by the prmt lines
                num = min(kc_groups, groups - kc)
                xs[:] = 0xDEAD  # stale values must all be overwritten
                for m in range(8 * nt_count):
                    for piece in range(8 * num):
                        if m < m_rows:
                            h0 = kc * 64 + 8 * piece
                            v = x_bits[m, h0 : h0 + 8]
                            u = {
                                n: int(v[2 * i] | (v[2 * i + 1] << 16))
                                for i, n in enumerate("xyzw")
                            }
                            o = {ow: _prmt(u[a], u[b], sel) for sel, ow, a, b in stage}
                            vals = []
                            for n in "xyzw":
                                vals += [o[n] & 0xFFFF, o[n] >> 16]
                        else:
                            vals = [0] * 8
                        xs[m * k_row + 8 * piece : m * k_row + 8 * piece + 8] = vals
            for warp in range(8):
                a_tile = np.zeros((4, 16, 16))
                b_ok = []
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    row_g = block * 128 + warp * 16 + g
                    rg = min(row_g, rows - 1)
                    rg8 = min(row_g + 8, rows - 1)
                    byte = 32 * kc + 8 * t  # ld_stream8: words byte / 4, byte / 4 + 1
                    w = {
                        "wg": words[rg, byte // 4 : byte // 4 + 2],
                        "wg8": words[rg8, byte // 4 : byte // 4 + 2],
                    }
                    for u in range(2):
                        for di, j, p, src in a_lines:
                            reg = _halves(_nibble_pair(int(w[src][u]), p, k))
                            i = 2 * u + di
                            r = g + 8 * (j & 1)
                            col = 2 * t + 8 * (j >> 1)
                            a_tile[i, r, col : col + 2] = reg
                    b_ok.append(scale[rg, kc])
                for nt in range(nt_count):
                    b_tile = np.zeros((4, 16, 8))
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        base = g * k_row + 16 * t + kl * 64 + nt * 8 * k_row
                        xv = xs[base : base + 16].astype(np.int64)
                        xb = [int(xv[2 * i] | (xv[2 * i + 1] << 16)) for i in range(8)]
                        for i in range(4):
                            b_tile[i, 2 * t : 2 * t + 2, g] = _halves(xb[2 * i])
                            b_tile[i, 2 * t + 8 : 2 * t + 10, g] = _halves(xb[2 * i + 1])
                    frag = sum(a_tile[i] @ b_tile[i] for i in range(4))  # [16 rows, 8 cols]
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        row_g = block * 128 + warp * 16 + g
                        sg = scale[min(row_g, rows - 1), kc]
                        sg8 = scale[min(row_g + 8, rows - 1), kc]
                        c = (
                            frag[g, 2 * t],
                            frag[g, 2 * t + 1],
                            frag[g + 8, 2 * t],
                            frag[g + 8, 2 * t + 1],
                        )
                        acc[warp, lane, nt] += np.array(c) * np.array([sg, sg, sg8, sg8])
        for warp in range(8):
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                row_g = block * 128 + warp * 16 + g
                for nt in range(nt_count):
                    for e in range(2):
                        m = 8 * nt + 2 * t + e
                        if m >= m_rows:
                            continue
                        if row_g < rows:
                            out[m, row_g] = acc[warp, lane, nt, e]
                        if row_g + 8 < rows:
                            out[m, row_g + 8] = acc[warp, lane, nt, 2 + e]
    return out


@pytest.mark.parametrize(
    "m_rows,hidden,rows",
    [(1, 192, 37), (5, 320, 150), (13, 640, 19), (64, 320, 21)],
    ids=["1x192x37", "5x320x150", "13x640x19", "64x320x21"],
)
def test_lane_emulation_equals_the_twin(m_rows: int, hidden: int, rows: int) -> None:
    """M not a multiple of 8, R not a multiple of 16 or 128, chunks cut by the group count."""
    g = torch.Generator().manual_seed(m_rows * 1000 + hidden + rows)
    packed = torch.randint(0, 256, (rows, hidden // 2), dtype=torch.uint8, generator=g)
    scale = torch.rand(rows, hidden // 64, generator=g) * 0.05 + 1e-3
    x = (torch.randn(m_rows, hidden, generator=g) * 3).to(torch.bfloat16)
    got = _emulate(x.double().numpy(), packed.numpy(), scale.double().numpy())
    assert not np.isnan(got).any()  # every (x row, weight row) was stored
    q = int4_ref.unpack_int4(packed).double().reshape(rows, -1, 64)
    weight = (q * scale.double()[..., None]).reshape(rows, hidden)  # exact in fp64
    exact = x.double() @ weight.T
    np.testing.assert_allclose(got, exact.numpy(), rtol=1e-12, atol=1e-12)
    twin = int4_ref.int4_linear(x, packed, scale).double().numpy()
    np.testing.assert_allclose(got, twin, rtol=1e-5, atol=1e-5)


def test_launcher_picks_the_tensor_core_kernel_for_bf16_up_to_64_rows() -> None:
    bf = torch.zeros(64, 128, dtype=torch.bfloat16)
    assert int4_cuda.uses_mma(bf) and int4_cuda.uses_mma(bf[:1])
    assert not int4_cuda.uses_mma(bf, tensor_cores=False)
    assert not int4_cuda.uses_mma(torch.zeros(65, 128, dtype=torch.bfloat16))
    assert not int4_cuda.uses_mma(torch.zeros(4, 128))  # fp32 x: the CUDA-core kernel
    packed = torch.zeros(16, 64, dtype=torch.uint8)
    scale = torch.ones(16, 2)
    problem = int4_cuda._problem
    # 9..64 bf16 rows pass the format checks (the CPU device is the only refusal left)
    assert "CUDA device" in problem(bf[:9], packed, scale)
    assert "1..8" in problem(bf[:9], packed, scale, tensor_cores=False)
    assert "1..64 of bf16" in problem(torch.zeros(65, 128, dtype=torch.bfloat16), packed, scale)
    assert set(int4_cuda.MMA_DEPTH) == set(range(1, 9))
