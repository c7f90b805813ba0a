"""The tensor-core grouped expert GEMV (`expert_group_mma`, expert_gemv.cu) emulated on the CPU,
and the launcher's and dispatch's choice between it and the CUDA-core kernel.

No GPU here, so the kernel's arithmetic is replayed lane by lane: what each lane (g, t) loads
(16 bytes of weight rows row0 + g and row0 + g + 8 and of staged input g at element 32 s + 8 t,
zeros past K), which words become which mma operand registers, and the output fragment's stores.
The mma itself is PTX's m16n8k16 layout written out independently here (a0 = A[g][2t, 2t+1],
a1 = A[g+8][..], a2 = A[g][2t+8, 2t+9], a3 = A[g+8][..]; b0 = B[2t, 2t+1][g], b1 = B[2t+8,
2t+9][g]; c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][..]) and multiplied in float64, so a wrong
register order, k mapping or store shows up as a wrong product. Staged rows carry NaN outside the
staged inputs (the pad and rows >= count), so reading them would show too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from ninfer.kernels import dispatch
from ninfer.kernels import runtime as rt
from ninfer.kernels.expert_gemv import launch as expert_launch
from ninfer.kernels.expert_gemv import reference as expert_ref
from support.mma_fragments import G, T, bits, ptx_accumulator, ptx_tiles, words

PAD = expert_launch.GROUP_MMA_PAD
NAN_BITS = 0x7FC0


def staged_inputs(x: torch.Tensor, rows: list[int], swiglu: bool) -> torch.Tensor:
    """The staged bf16 rows, as the kernel stages them (SwiGLU rounded like silu_mul)."""
    picked = x[rows]
    if swiglu:
        gate, up = picked.chunk(2, dim=-1)
        picked = torch.nn.functional.silu(gate) * up
    return picked


def step_registers(
    wb: np.ndarray, xs: np.ndarray, row0: int, s: int, nt: int, count: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(a [32, 4], b [32, 2]) registers of step s's two mma (h = 0, 1) for n-tile nt, as the
    kernel fills them: lane (g, t) loads elements 32 s + 8 t .. + 7 of weight rows row0 + g and
    row0 + g + 8 (clamped to N - 1) and of staged input 8 nt + g (clamped to count - 1), zeros
    past K; mma h takes words 2h, 2h + 1 of each (a0 = w, a1 = v, a2 = w', a3 = v')."""
    n, k = wb.shape
    col = 32 * s + 8 * T
    ok = (col < k)[:, None]
    cols = np.minimum(col, k - 8)[:, None] + np.arange(8)
    w = np.where(ok, words(wb[np.minimum(row0 + G, n - 1)[:, None], cols]), 0)
    v = np.where(ok, words(wb[np.minimum(row0 + G + 8, n - 1)[:, None], cols]), 0)
    x = np.where(ok, words(xs[np.minimum(8 * nt + G, count - 1)[:, None], cols]), 0)
    return [
        (
            np.stack([w[:, 2 * h], v[:, 2 * h], w[:, 2 * h + 1], v[:, 2 * h + 1]], axis=1),
            np.stack([x[:, 2 * h], x[:, 2 * h + 1]], axis=1),
        )
        for h in range(2)
    ]


def warp_accumulators(wb: np.ndarray, xs: np.ndarray, row0: int, count: int, tiles: int):
    """[tiles, 32, 4] accumulator registers of the warp owning rows row0 .. row0 + 15."""
    k = wb.shape[1]
    acc = np.zeros((tiles, 16, 8))
    for s in range(-(-k // 32)):
        for nt in range(tiles):
            if nt == 1 and count <= 8:
                continue  # `two` is false: n-tile 1 idles
            for a, b in step_registers(wb, xs, row0, s, nt, count):
                tile_a, tile_b = ptx_tiles(a, b)
                acc[nt] += tile_a @ tile_b
    return np.stack([ptx_accumulator(d) for d in acc])


def store(out: np.ndarray, c: np.ndarray, row0: int, assigned: list[int]) -> None:
    """The epilogue: c0, c1 -> row row0 + g of inputs 8 nt + 2t, + 1; c2, c3 -> row + 8."""
    n = out.shape[1]
    for nt in range(c.shape[0]):
        for lane in range(32):
            for half in range(2):
                m = 8 * nt + 2 * T[lane] + half
                if m >= len(assigned):
                    continue
                row = row0 + G[lane]
                if row < n:
                    out[assigned[m], row] = c[nt, lane, half]
                if row + 8 < n:
                    out[assigned[m], row + 8] = c[nt, lane, 2 + half]


def emulate(
    x: torch.Tensor,
    w: torch.Tensor,
    order: torch.Tensor,
    ends: torch.Tensor,
    *,
    x_div: int,
    swiglu: bool,
    tiles: int,
) -> np.ndarray:
    """expert_group_mma's result before the bf16 rounding: [A, N] float64, NaN where no lane
    stored. Expert by expert, pass by pass (up to 8 tiles inputs), warp by warp."""
    num_experts, n, k = w.shape
    maxm = 8 * tiles
    wb = bits(w)
    out = np.full((order.numel(), n), np.nan)
    for e in range(num_experts):
        start = 0 if e == 0 else int(ends[e - 1])
        for base in range(start, int(ends[e]), maxm):
            assigned = [int(a) for a in order[base : min(base + maxm, int(ends[e]))]]
            xs = np.full((maxm, k + PAD), NAN_BITS, dtype=np.uint16)
            xs[: len(assigned), :k] = bits(staged_inputs(x, [a // x_div for a in assigned], swiglu))
            for row0 in range(0, n, 16):  # the warps of every block that own rows
                c = warp_accumulators(wb[e], xs, row0, len(assigned), tiles)
                store(out, c, row0, assigned)
    return out


def exact(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, x_div: int, swiglu: bool):
    """W[ids[a]] @ staged(x[a / x_div]) in float64 (bf16 products and their sums are exact)."""
    staged = staged_inputs(x, [a // x_div for a in range(ids.numel())], swiglu).double()
    return torch.einsum("ank,ak->an", w.double()[ids], staged).numpy()


CASES = [
    # experts, n, k, tokens, rows_per_input, swiglu, ids (None: random)
    pytest.param(3, 40, 72, 7, 2, False, [1] * 11 + [2] * 3, id="k72-n40-run11"),
    pytest.param(4, 24, 64, 20, 1, True, None, id="swiglu-k64"),
    pytest.param(2, 16, 8, 9, 2, False, [0] * 18, id="k8-run18"),
    pytest.param(3, 136, 96, 6, 3, False, None, id="two-blocks"),
]


@pytest.mark.parametrize("tiles", [1, 2])
@pytest.mark.parametrize("experts,n,k,tokens,per_input,swiglu,ids", CASES)
def test_lane_fragments_compute_the_grouped_products(
    tiles, experts, n, k, tokens, per_input, swiglu, ids
) -> None:
    """Every assignment's output row equals W[id] @ x in float64 (every element stored exactly
    once: NaN marks a row no lane wrote), against fp32 matmul and, rounded, the twin."""
    gen = torch.Generator().manual_seed(1000 * k + n + tiles)
    width = 2 * k if swiglu else k
    x = torch.randn(tokens, width, generator=gen).to(torch.bfloat16)
    w = (torch.randn(experts, n, k, generator=gen) / k**0.5).to(torch.bfloat16)
    num = tokens * per_input
    if ids is None:
        flat = torch.randint(0, experts, (num,), generator=gen)
    else:
        flat = torch.tensor(ids, dtype=torch.int64)
        assert flat.numel() == num
    order, ends = expert_ref.expert_groups(flat, experts)
    got = emulate(x, w, order, ends, x_div=per_input, swiglu=swiglu, tiles=tiles)
    assert not np.isnan(got).any()
    want = exact(x, w, flat, per_input, swiglu)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    staged = staged_inputs(x, [a // per_input for a in range(num)], swiglu).float()
    fp32 = torch.einsum("ank,ak->an", w.float()[flat], staged).numpy()
    np.testing.assert_allclose(got, fp32, rtol=1e-5, atol=1e-5)
    twin = expert_ref.expert_group_gemv(
        x, w, flat, rows_per_input=per_input, swiglu_input=swiglu
    ).float()
    rounded = torch.from_numpy(got).to(torch.bfloat16).float()
    assert ((rounded - twin).norm() / twin.norm()).item() < 1e-2


def test_each_mma_pair_takes_every_k_of_a_step_once() -> None:
    """Slot -> k of the header: mma h, slot 2t + e is k 8t + 4h + e, slot 2t + 8 + e is k 8t + 4h
    + 2 + e; over both mma the 32 k of a step, once each (the matmul test relies on it)."""
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


@pytest.mark.parametrize("k", [512, 2048])
def test_staged_rows_are_read_without_bank_conflicts(k: int) -> None:
    """The quarter-warps of a 16-byte shared load (lanes 8q .. 8q + 7: inputs g = 2q, 2q + 1, t =
    0..3) touch 32 distinct banks at the 35B widths, thanks to the 64-byte pad."""
    stride = (k + PAD) * 2  # bytes
    for s in range(k // 32):
        for q in range(4):
            banks = []
            for lane in range(8 * q, 8 * q + 8):
                g, t = lane >> 2, lane & 3
                addr = g * stride + (32 * s + 8 * t) * 2
                banks += [(addr // 4 + i) % 32 for i in range(4)]
            assert sorted(banks) == list(range(32))


# --- the launcher's and dispatch's choice -------------------------------------------------------


class Launches:
    """Records launches with the CUDA runtime mocked out; `mma` is the device's sm_80+ answer."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, mma: bool = True) -> None:
        self.calls: list[dict[str, Any]] = []
        self.opted_in: list[tuple[str, int]] = []
        monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
        monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
        monkeypatch.setattr(rt, "check_cuda", lambda *t: torch.device("cpu"))
        monkeypatch.setattr(rt, "device_index", lambda device: 0)
        monkeypatch.setattr(
            rt, "allow_shared", lambda op, instance, index, n: self.opted_in.append((instance, n))
        )
        monkeypatch.setattr(rt, "get_kernel", lambda op, instance, device: instance)
        monkeypatch.setattr(rt, "launch", self.launch)
        monkeypatch.setattr(expert_launch, "_mma_capable", lambda device: mma)

    def launch(self, kernel, grid, block, args, device, *, shared_mem: int = 0) -> None:
        self.calls.append({"instance": kernel, "grid": grid, "block": block, "smem": shared_mem})


def gate_up_call(**kw: Any) -> None:
    """The 35B gate-up at 64 rows: x [64, 2048], experts [E, 1024, 2048], 8 rows per input."""
    x = torch.zeros(64, 2048, dtype=kw.pop("dtype", torch.bfloat16))
    experts = torch.zeros(3, 1024, 2048, dtype=x.dtype)
    ids = torch.randint(0, 3, (512,))
    expert_launch.expert_group_gemv(x, experts, ids, rows_per_input=8, **kw)


def down_call(**kw: Any) -> None:
    """The 35B down at 64 rows: SwiGLU inputs [512, 1024], experts [E, 2048, 512]."""
    x = torch.zeros(512, 1024, dtype=kw.pop("dtype", torch.bfloat16))
    experts = torch.zeros(3, 2048, 512, dtype=x.dtype)
    ids = torch.randint(0, 3, (512,))
    expert_launch.expert_group_gemv(x, experts, ids, rows_per_input=1, swiglu_input=True, **kw)


RING = (expert_launch.GROUP_MMA_CP_DEPTH + 1) * 2 * 256 * 16  # the CP form's weight ring


def test_mma_launch_at_35b_shapes(monkeypatch) -> None:
    """Gate-up: passes of 8 inputs (16 would need 65 KiB), 8 row tiles of 128; down: passes of
    16 (17 KiB), 16 row tiles; both in the CP form (the weight ring's bytes on top of the staged
    inputs) unless a register-ring depth is asked for; with `group_mma_wide` switched on the
    gate-up takes passes of 16 (65 KiB + the ring, opted in)."""
    launches = Launches(monkeypatch)
    gate_up_call()
    down_call()
    down_call(depth=2)
    monkeypatch.setenv("NINFER_KERNELS_ON", "group_mma_wide")
    gate_up_call()
    cp = expert_launch.GROUP_MMA_CP_DEPTH
    up, down, shallow, wide = launches.calls
    assert up["instance"] == f"expert_group_mma<{cp}, 1, false, true>"
    assert up["grid"] == (8, 3) and up["block"] == (256,) and up["smem"] == 8 * 2080 * 2 + RING
    assert down["instance"] == f"expert_group_mma<{cp}, 2, true, true>"
    assert down["grid"] == (16, 3) and down["smem"] == 16 * 544 * 2 + RING
    assert shallow["instance"] == "expert_group_mma<2, 2, true>"
    assert shallow["smem"] == 16 * 544 * 2  # the register ring stages inputs only
    assert wide["instance"] == f"expert_group_mma<{cp}, 2, false, true>"
    assert wide["smem"] == 16 * 2080 * 2 + RING
    # every mma launch asks for its shared memory (allow_shared does nothing up to 48 KiB)
    assert [i for i, _ in launches.opted_in] == [c["instance"] for c in launches.calls]
    assert [n for _, n in launches.opted_in] == [c["smem"] for c in launches.calls]
    # two blocks an SM still fit the 228 KiB of an sm_90 SM
    assert 2 * up["smem"] <= 228 * 1024
    with pytest.raises(rt.KernelInputError, match="depth"):
        down_call(depth=3)


def test_cp_ring_switched_off_runs_the_register_ring(monkeypatch) -> None:
    """`NINFER_KERNELS_OFF=group_mma_cp`: both grouped GEMVs run the register ring at
    GROUP_MMA_DEPTH with the staged inputs' shared memory only; an explicit depth still wins."""
    launches = Launches(monkeypatch)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "group_mma_cp")
    assert not expert_launch.uses_cp_ring()
    gate_up_call()
    down_call()
    down_call(depth=2)
    up, down, shallow = launches.calls
    depth = expert_launch.GROUP_MMA_DEPTH
    assert up["instance"] == f"expert_group_mma<{depth}, 1, false>"
    assert up["smem"] == 8 * 2080 * 2
    assert down["instance"] == f"expert_group_mma<{depth}, 2, true>"
    assert down["smem"] == 16 * 544 * 2
    assert shallow["instance"] == "expert_group_mma<2, 2, true>"


@pytest.mark.parametrize(
    "kw,mma",
    [
        ({"tensor_cores": False}, True),  # the switch (dispatch: NINFER_KERNELS_OFF)
        ({"dtype": torch.float32}, True),  # fp32 models keep exact fp32 products
        ({}, False),  # no sm_80+
    ],
    ids=["switched-off", "fp32", "pre-sm80"],
)
def test_fma_kernel_where_the_mma_does_not_serve(kw, mma, monkeypatch) -> None:
    launches = Launches(monkeypatch, mma=mma)
    dtype = kw.get("dtype", torch.bfloat16)
    gate_up_call(**kw)
    down_call(**kw)
    up, down = launches.calls
    cuda_type = rt.cuda_type(torch.zeros(1, dtype=dtype), "x")
    assert up["instance"] == f"expert_group_gemv<{cuda_type}, 4, 4, false>"
    assert up["grid"] == (32, 3) and up["smem"] == 4 * 2048 * torch.zeros(1, dtype=dtype).itemsize
    assert down["instance"] == f"expert_group_gemv<{cuda_type}, 8, 4, true>"


def test_uses_group_mma_rules(monkeypatch) -> None:
    """bf16 and one n-tile of staged rows within 48 KiB (K <= 3,040) on an sm_80+ device; two
    n-tiles within 48 KiB (GROUP_MMA_WIDE_SMEM with `group_mma_wide` switched on)."""
    monkeypatch.setattr(expert_launch, "_mma_capable", lambda device: True)
    uses = expert_launch.uses_group_mma
    bf16 = torch.bfloat16
    x = torch.zeros(2, 8, dtype=bf16)
    assert uses(x, torch.zeros(2, 4, 3040, dtype=bf16))
    assert not uses(x, torch.zeros(2, 4, 3048, dtype=bf16))
    assert not uses(x.float(), torch.zeros(2, 4, 512))
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    tiles = expert_launch.group_mma_tiles
    assert tiles(512) == 2
    assert tiles(1504) == 2  # 16 x 1536 x 2 bytes = 48 KiB
    assert tiles(1512) == 1
    assert tiles(2048) == 1
    monkeypatch.setenv("NINFER_KERNELS_ON", "group_mma_wide")
    assert tiles(512) == 2 and tiles(2048) == 2  # 16 x 2080 x 2 bytes = 65 KiB, opted in
    assert tiles(3040) == 2 and tiles(3048) == 1  # 16 x 3072 x 2 bytes = 96 KiB
    monkeypatch.delenv("NINFER_KERNELS_ON")
    monkeypatch.setattr(expert_launch, "_mma_capable", lambda device: False)
    assert not uses(x, torch.zeros(2, 4, 512, dtype=bf16))
    monkeypatch.undo()
    assert not expert_launch._mma_capable(torch.device("cpu"))


def test_dispatch_switches_the_mma_off_by_name(monkeypatch) -> None:
    """`expert_group_mma` in NINFER_KERNELS_OFF keeps the CUDA-core kernel (not the twin);
    `expert_group_gemv` there runs the twin."""
    seen: list[bool] = []

    def kernel(*args: Any, tensor_cores: bool, **kw: Any) -> str:
        seen.append(tensor_cores)
        return "kernel"

    def use_cuda_kernels(t: torch.Tensor, op: str | None = None) -> bool:
        return not dispatch.switched_off(op)

    monkeypatch.setattr(dispatch, "use_cuda_kernels", use_cuda_kernels)
    monkeypatch.setattr(dispatch._expert_gemv_cuda, "supports_group", lambda *a, **kw: True)
    monkeypatch.setattr(dispatch._expert_gemv_cuda, "expert_group_gemv", kernel)
    x = torch.randn(2, 16).to(torch.bfloat16)
    w = torch.randn(3, 8, 16).to(torch.bfloat16)
    ids = torch.tensor([0, 2])

    def call():
        return dispatch.expert_group_gemv(x, w, ids, rows_per_input=1)

    monkeypatch.setenv("NINFER_KERNELS_OFF", "")
    assert call() == "kernel"
    monkeypatch.setenv("NINFER_KERNELS_OFF", "expert_group_mma")
    assert call() == "kernel"
    assert seen == [True, False]
    monkeypatch.setenv("NINFER_KERNELS_OFF", "expert_group_gemv")
    twin = call()
    assert isinstance(twin, torch.Tensor) and seen == [True, False]
    assert torch.equal(twin, expert_ref.expert_group_gemv(x, w, ids, rows_per_input=1))
