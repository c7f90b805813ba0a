"""The bf16 GEMV's twin, its launcher's operand checks and launch plan, and dispatch's routing
(CPU).

The twin is `F.linear` by definition (every CPU call runs it), so the test pins that down and
that `dispatch.linear` on CPU tensors is still exactly `F.linear`. The plan tests check the host
arithmetic the kernel relies on: every output row covered by exactly one warp group, no lane
without a chunk where the row has enough of them, and the compiled limits (M * R <= 32).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.support.kernel_sources import parameter_count

from ninfer.kernels import dispatch, runtime
from ninfer.kernels.bf16_gemv import launch as bf16_cuda
from ninfer.kernels.bf16_gemv import reference as bf16_ref

SHAPES = [(2048, 4096), (5120, 6144), (12352, 2048), (16480, 5120), (34816, 5120), (257, 2048)]


@pytest.fixture
def seed() -> int:
    return torch.seed() % 2**31


@pytest.mark.parametrize("rows", [1, 3, 8, 20])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_twin_and_cpu_dispatch_are_f_linear(rows: int, dtype: torch.dtype, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 64, generator=g).to(dtype)
    w = torch.randn(40, 64, generator=g).to(dtype)
    want = F.linear(x, w)
    got = bf16_ref.bf16_linear(x, w)
    assert got.dtype == dtype and torch.equal(got, want), f"seed {seed}"
    assert not dispatch.bf16_gemv_routed(x, w)  # CPU tensors never take the kernel
    assert torch.equal(dispatch.linear(x, w), want), f"seed {seed}"


def test_preferred_follows_the_measured_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    preferred = bf16_cuda.bf16_gemv_preferred
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    # one row: every shape (the 27B's gate-up and an lm_head too)
    for n, k in ((2048, 4096), (34816, 5120), (12352, 2048), (248320, 2048), (8193, 5120)):
        assert preferred(1, n, k), (n, k)
    # with gemv_one_row off, the per-kernel table: N up to ONE_ROW_MAX_OUT at any K, up to
    # SHORT_K_MAX_OUT for K <= SHORT_K
    monkeypatch.setenv("NINFER_KERNELS_OFF", "gemv_one_row")
    assert preferred(1, 2048, 4096) and preferred(1, 5120, 6144) and preferred(1, 8192, 5120)
    assert not preferred(1, 8193, 5120)
    assert not preferred(1, 34816, 5120)
    assert preferred(1, 12352, 2048)  # the 35B-A3B's in_proj
    assert not preferred(1, 16385, 2048)
    assert not preferred(1, 248320, 2048)  # an lm_head
    # several rows (a batch, a verify step): small matrices only
    for rows in range(2, bf16_cuda.MAX_ROWS + 1):
        assert preferred(rows, 2048, 4096) and preferred(rows, 257, 2048), rows
        assert preferred(rows, 1024, 2048) and preferred(rows, 2048, 512), rows
        assert not preferred(rows, 5120, 6144), rows  # the 27B's out_proj / o_proj
        assert not preferred(rows, 12352, 2048), rows  # cuBLAS 16.2 µs against 27.5 at 4 rows
        assert not preferred(rows, 2048, 4097), rows
    assert not preferred(0, 2048, 4096)
    assert not preferred(bf16_cuda.MAX_ROWS + 1, 2048, 4096)
    assert not preferred(1, 0, 4096)
    # the constants are the knobs (the table's with gemv_one_row off)
    monkeypatch.setattr(bf16_cuda, "ONE_ROW_MAX_OUT", 65536)
    assert preferred(1, 34816, 5120) and not preferred(2, 34816, 5120)
    monkeypatch.setattr(bf16_cuda, "MULTI_ROW_MAX_WEIGHTS", 0)
    assert not preferred(3, 257, 2048)


def test_problem_rejects_bad_operands() -> None:
    """The operand checks come before the device check, so their messages show on the CPU."""
    bf16 = torch.bfloat16
    problem = bf16_cuda._problem
    x = torch.randn(2, 64).to(bf16)
    w = torch.randn(40, 64).to(bf16)
    assert "2-D" in problem(x[None], w)
    assert "bfloat16" in problem(x.float(), w)
    assert "bfloat16" in problem(x, w.half())
    assert "1..8" in problem(torch.randn(9, 64).to(bf16), w)
    assert "1..8" in problem(torch.randn(0, 64).to(bf16), w)
    assert "does not match" in problem(x, w[:, :32])
    assert "multiple of 8" in problem(torch.randn(2, 12).to(bf16), torch.randn(4, 12).to(bf16))
    assert "dense" in problem(torch.randn(64, 2).to(bf16).T, w)  # column-major x
    wide = torch.randn(2, 68).to(bf16)
    assert "row stride" in problem(wide[:, :64], w)  # 136-byte rows: not a multiple of 16
    assert "contiguous" in problem(x, torch.randn(64, 40).to(bf16).T)
    assert "CUDA" in problem(x, w)  # well-formed, but on the CPU
    assert not bf16_cuda.supports(x, w)
    with pytest.raises(runtime.KernelInputError, match="CUDA device"):
        bf16_cuda.bf16_linear(x, w)


def test_problem_of_the_swiglu_input_form() -> None:
    """With `swiglu_input` x is [M, 2K] (gate then up) against W [N, K]; a plain-width x, or a
    gate-up row against a weight of the wrong K, is refused with the shapes named."""
    bf16 = torch.bfloat16
    w = torch.randn(40, 64).to(bf16)
    gate_up = torch.randn(2, 128).to(bf16)
    assert "CUDA" in bf16_cuda._problem(gate_up, w, True)  # well-formed, but on the CPU
    assert "[gate | up] x (2, 64) does not match weight (40, 64)" in bf16_cuda._problem(
        gate_up[:, :64], w, True
    )
    assert "does not match" in bf16_cuda._problem(gate_up, w)  # the plain form wants K columns
    assert not bf16_cuda.supports(gate_up, w, swiglu_input=True)


@pytest.mark.parametrize("rows", [1, 3, 9])
def test_swiglu_linear_on_the_cpu_is_silu_mul_then_linear(rows: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for dtype in (torch.float32, torch.bfloat16):
        gate_up = torch.randn(rows, 2 * 48, generator=g).to(dtype)
        w = torch.randn(24, 48, generator=g).to(dtype)
        want = F.linear(dispatch.silu_mul(gate_up), w)
        assert torch.equal(bf16_ref.swiglu_linear(gate_up, w), want), f"seed {seed}"
        assert not dispatch.bf16_gemv_routed(gate_up, w, swiglu_input=True)
        assert torch.equal(dispatch.swiglu_linear(gate_up, w), want), f"seed {seed}"


def test_swiglu_routing_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a GPU (device checks stubbed): the SwiGLU form follows the plain routing rule for
    the down projection's shape, and `swiglu_gemv` in NINFER_KERNELS_OFF turns off only it."""
    monkeypatch.setattr(dispatch, "use_cuda_kernels", lambda t, op=None: op == "bf16_gemv")
    monkeypatch.setattr(bf16_cuda, "supports", lambda x, w, swiglu_input=False, gate=None: True)
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    bf16 = torch.bfloat16
    down = torch.zeros(5120, 17408, dtype=bf16)  # the 27B's down projection
    one, four = torch.zeros(1, 2 * 17408, dtype=bf16), torch.zeros(4, 2 * 17408, dtype=bf16)
    assert dispatch.bf16_gemv_routed(one, down, swiglu_input=True)
    assert not dispatch.bf16_gemv_routed(four, down, swiglu_input=True)  # cuBLAS from 2 rows
    calls: list[bool] = []
    monkeypatch.setattr(
        bf16_cuda,
        "bf16_linear",
        lambda x, w, swiglu_input=False, gate=None: (
            calls.append(swiglu_input) or x[:, : w.shape[0]]
        ),
    )
    dispatch.swiglu_linear(one, down)
    assert calls == [True]
    monkeypatch.setenv("NINFER_KERNELS_OFF", "swiglu_gemv")
    assert not dispatch.bf16_gemv_routed(one, down, swiglu_input=True)
    monkeypatch.setattr(dispatch, "silu_mul", lambda gu: gu[:, : gu.shape[1] // 2])
    dispatch.swiglu_linear(one, down)  # silu_mul, then the plain routed GEMV
    assert calls == [True, False]


def test_swiglu_mlp_routing_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a GPU (device checks stubbed): `swiglu_mlp` takes the gate-up GEMV's SwiGLU output
    form for one x row the plain GEMV would take, then the plain down GEMV; with
    `NINFER_KERNELS_OFF=gate_up_swiglu`, or where the form does not fit, the gate-up projection
    and `swiglu_linear` (the down projection's SwiGLU input form)."""
    monkeypatch.setattr(dispatch, "use_cuda_kernels", lambda t, op=None: op == "bf16_gemv")
    monkeypatch.setattr(bf16_cuda, "supports", lambda x, w, swiglu_input=False, gate=None: True)
    monkeypatch.setattr(bf16_cuda, "swiglu_output_problem", lambda x, w: None)
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    bf16 = torch.bfloat16
    gate_up, down = torch.zeros(2 * 64, 32, dtype=bf16), torch.zeros(32, 64, dtype=bf16)
    calls: list[str] = []
    monkeypatch.setattr(
        bf16_cuda, "gate_up_swiglu", lambda x, w: calls.append("out") or x.new_zeros(1, 64)
    )
    monkeypatch.setattr(
        bf16_cuda,
        "bf16_linear",
        lambda x, w, swiglu_input=False, gate=None: (
            calls.append("in" if swiglu_input else "plain") or x.new_zeros(x.shape[0], w.shape[0])
        ),
    )
    one = torch.zeros(1, 32, dtype=bf16)
    dispatch.swiglu_mlp(one, gate_up, down)
    assert calls == ["out", "plain"]
    calls.clear()
    monkeypatch.setenv("NINFER_KERNELS_OFF", "gate_up_swiglu")
    dispatch.swiglu_mlp(one, gate_up, down)
    assert calls == ["plain", "in"]
    calls.clear()
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    monkeypatch.setattr(bf16_cuda, "swiglu_output_problem", lambda x, w: "too small")
    dispatch.swiglu_mlp(one, gate_up, down)
    assert calls == ["plain", "in"]


def testgate_problem_names_what_is_wrong() -> None:
    bf16 = torch.bfloat16
    x = torch.randn(2, 4 * 16).to(bf16)
    qg = torch.randn(2, 4, 2, 16).to(bf16)  # [M, H, (q, gate), D]: the gate a strided view
    gate = qg[:, :, 1]
    assert bf16_cuda.gate_problem(x, gate) is None
    assert "bf16 [M, H, D]" in bf16_cuda.gate_problem(x, gate.float())
    assert "bf16 [M, H, D]" in bf16_cuda.gate_problem(x, gate.reshape(2, -1))
    assert "does not match" in bf16_cuda.gate_problem(x, gate[:1])
    assert "does not match" in bf16_cuda.gate_problem(x[:, :32], gate)
    assert "dense runs" in bf16_cuda.gate_problem(x, torch.randn(2, 4, 32).to(bf16)[:, :, ::2])
    odd = torch.randn(2, 4, 2 * 16 + 2).to(bf16)[:, :, 1:17]  # heads start 2 bytes in
    assert "16-byte" in bf16_cuda.gate_problem(x, odd)


@pytest.mark.parametrize("rows", [1, 3, 9])
def test_sigmoid_gate_linear_on_the_cpu_is_the_eager_ops(rows: int, seed: int) -> None:
    """The twin and the CPU dispatch are exactly the gated attention's old eager tail."""
    g = torch.Generator().manual_seed(seed)
    for dtype in (torch.float32, torch.bfloat16):
        o = torch.randn(rows, 3, 16, generator=g).to(dtype)
        qg = torch.randn(rows, 3, 2, 16, generator=g).to(dtype)
        w = torch.randn(24, 48, generator=g).to(dtype)
        want = F.linear((o * torch.sigmoid(qg[:, :, 1])).reshape(rows, -1), w)
        assert torch.equal(bf16_ref.sigmoid_gate_linear(o, qg[:, :, 1], w), want), f"seed {seed}"
        assert torch.equal(dispatch.sigmoid_gate_linear(o, qg[:, :, 1], w), want), f"seed {seed}"


def test_sigmoid_gate_routing_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a GPU (device checks stubbed): the gate form follows the plain routing rule for
    o_proj's shape, and `sigmoid_gate_gemv` in NINFER_KERNELS_OFF turns off only it."""
    monkeypatch.setattr(dispatch, "use_cuda_kernels", lambda t, op=None: op == "bf16_gemv")
    monkeypatch.setattr(bf16_cuda, "supports", lambda x, w, swiglu_input=False, gate=None: True)
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    bf16 = torch.bfloat16
    o_proj = torch.zeros(5120, 6144, dtype=bf16)  # the 27B's
    o, gate = torch.zeros(1, 24, 256, dtype=bf16), torch.zeros(1, 24, 256, dtype=bf16)
    assert dispatch.bf16_gemv_routed(o.reshape(1, -1), o_proj, gate=gate)
    calls: list[object] = []
    monkeypatch.setattr(
        bf16_cuda,
        "bf16_linear",
        lambda x, w, swiglu_input=False, gate=None: calls.append(gate) or x[:, : w.shape[0]],
    )
    dispatch.sigmoid_gate_linear(o, gate, o_proj)
    assert len(calls) == 1 and calls[0] is gate
    four = torch.zeros(4, 24, 256, dtype=bf16)  # a verify step's rows: cuBLAS for this shape
    assert not dispatch.bf16_gemv_routed(four.reshape(4, -1), o_proj, gate=four)
    # the 35B's o_proj takes the plain GEMV at 2 rows, but the gate form serves one row only
    small = torch.zeros(2048, 4096, dtype=bf16)
    two = torch.zeros(2, 16, 256, dtype=bf16)
    assert dispatch.bf16_gemv_routed(two.reshape(2, -1), small)
    assert not dispatch.bf16_gemv_routed(two.reshape(2, -1), small, gate=two)
    assert dispatch.bf16_gemv_routed(two[:1].reshape(1, -1), small, gate=two[:1])
    assert not dispatch.bf16_gemv_routed(torch.zeros(2, 1024, dtype=bf16), torch.zeros(
        2048, 512, dtype=bf16), swiglu_input=True)  # fmt: skip
    monkeypatch.setenv("NINFER_KERNELS_OFF", "sigmoid_gate_gemv")
    assert not dispatch.bf16_gemv_routed(o.reshape(1, -1), o_proj, gate=gate)
    assert dispatch.bf16_gemv_routed(o.reshape(1, -1), o_proj)
    dispatch.sigmoid_gate_linear(o, gate, o_proj)  # eager gate, then the plain routed GEMV
    assert len(calls) == 2 and calls[1] is None


@pytest.mark.parametrize("rows", range(1, 9))
@pytest.mark.parametrize("n,k", [*SHAPES, (1, 8), (37, 40), (2048, 512), (64, 2048)])
@pytest.mark.parametrize("num_sms", [132, 8])
def test_plan_covers_every_row_once(rows: int, n: int, k: int, num_sms: int) -> None:
    p = bf16_cuda.plan(rows, n, k, num_sms)
    assert p.rows_per_group in (1, 2, 4) and rows * p.rows_per_group <= 32
    assert 0 <= p.ks_log2 <= 3 and p.unroll == bf16_cuda.UNROLL[rows]
    # blocks x groups x R rows cover [0, n) and the last block starts inside it
    assert (p.blocks - 1) * p.rows_per_block < n <= p.blocks * p.rows_per_block
    chunks = k // bf16_cuda.CHUNK
    ks = 1 << p.ks_log2
    assert ks == 1 or 32 * ks <= chunks  # every lane of a split group has a chunk
    assert ks == 8 or 32 * ks * 2 > chunks  # and K is split as widely as that allows
    # R is lowered from 4 only while the grid has too few blocks for the SMs, and no further
    enough = bf16_cuda.MIN_BLOCKS_PER_SM * num_sms
    groups = 8 >> p.ks_log2
    if p.rows_per_group < 4:
        assert -(-n // (groups * 2 * p.rows_per_group)) < enough
    if p.rows_per_group > 1:
        assert p.blocks >= enough


def test_plan_of_the_35b_out_proj() -> None:
    """N = 2048, K = 4096 on 132 SMs: 8 warps split K, 4 rows each, 512 blocks (~3.9 per SM),
    each lane with 2 steps x 4 rows = 8 loads in flight (one batch)."""
    p = bf16_cuda.plan(1, 2048, 4096, 132)
    assert (p.rows_per_group, p.ks_log2, p.unroll, p.blocks) == (4, 3, 2, 512)


def test_wide_plan_of_the_27b_down_projection() -> None:
    """The opt-in R = 8 plan: N = 5120, K = 17408 on 132 SMs, 8 warps split K, 8 rows a group,
    U = 1 (the same 8 weight loads in flight per lane as R = 4, U = 2), 640 blocks; it still
    halves R on small N (2048 outputs: 8 rows would leave 256 blocks < 2 per SM)."""
    wide = {"unroll": bf16_cuda.WIDE_UNROLL, "max_rows_per_group": bf16_cuda.WIDE_ROWS_PER_GROUP}
    p = bf16_cuda.plan(1, 5120, 17408, 132, **wide)
    assert (p.rows_per_group, p.ks_log2, p.unroll, p.blocks) == (8, 3, 1, 640)
    assert p.rows_per_group * p.unroll == 4 * bf16_cuda.UNROLL[1]
    assert bf16_cuda.plan(1, 2048, 4096, 132, **wide).rows_per_group == 4
    assert bf16_cuda.plan(1, 5120, 17408, 132).rows_per_group == 4  # the default


def test_wide_rows_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off by default; `gemv_rows8` takes every one-row launch, `gemv_fused_rows8` the fused
    input forms only; never more than one x row (M * R accumulators per lane)."""
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    assert not bf16_cuda.wide_rows(1, fused=True) and not bf16_cuda.wide_rows(1, fused=False)
    monkeypatch.setenv("NINFER_KERNELS_ON", "gemv_fused_rows8")
    assert bf16_cuda.wide_rows(1, fused=True) and not bf16_cuda.wide_rows(1, fused=False)
    monkeypatch.setenv("NINFER_KERNELS_ON", "gemv_rows8")
    assert bf16_cuda.wide_rows(1, fused=True) and bf16_cuda.wide_rows(1, fused=False)
    assert not bf16_cuda.wide_rows(2, fused=False)


def test_dispatch_routing_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a GPU (the device checks stubbed): bf16 1..8 rows of routed shapes take the kernel,
    anything else F.linear; `NINFER_KERNELS_OFF=bf16_gemv` turns it off."""
    monkeypatch.setattr(dispatch, "use_cuda_kernels", lambda t, op=None: op == "bf16_gemv")
    monkeypatch.setattr(bf16_cuda, "supports", lambda x, w, swiglu_input=False, gate=None: True)
    bf16 = torch.bfloat16
    w = torch.zeros(2048, 64, dtype=bf16)
    assert dispatch.bf16_gemv_routed(torch.zeros(1, 64, dtype=bf16), w)
    assert dispatch.bf16_gemv_routed(torch.zeros(8, 64, dtype=bf16), w)
    out_proj = torch.zeros(5120, 6144, dtype=bf16)
    assert not dispatch.bf16_gemv_routed(torch.zeros(4, 6144, dtype=bf16), out_proj)
    assert not dispatch.bf16_gemv_routed(torch.zeros(9, 64, dtype=bf16), w)
    assert not dispatch.bf16_gemv_routed(torch.zeros(1, 64), w.float())
    assert not dispatch.bf16_gemv_routed(torch.zeros(1, 1, 64, dtype=bf16), w)
    wide = torch.zeros(9000, 4096, dtype=bf16)
    assert dispatch.bf16_gemv_routed(torch.zeros(1, 4096, dtype=bf16), wide)  # any one-row N
    assert not dispatch.bf16_gemv_routed(torch.zeros(2, 4096, dtype=bf16), wide)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "gemv_one_row")
    assert not dispatch.bf16_gemv_routed(torch.zeros(1, 4096, dtype=bf16), wide)
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(
        bf16_cuda, "bf16_linear", lambda x, w: calls.append((x.shape[0], w.shape[0])) or x
    )
    dispatch.linear(torch.zeros(3, 64, dtype=bf16), w)
    assert calls == [(3, 2048)]
    assert dispatch.linear(torch.zeros(12, 64, dtype=bf16), w).shape == (12, 2048)
    assert calls == [(3, 2048)]  # 12 rows: F.linear


def test_kill_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """`bf16_gemv` in NINFER_KERNELS_OFF, or NINFER_KERNELS=torch, is seen by the routing."""
    monkeypatch.setattr(runtime, "cupy_available", lambda: True)
    fake_cuda = type("FakeCuda", (), {"is_cuda": True})()
    assert dispatch.use_cuda_kernels(fake_cuda, "bf16_gemv")
    monkeypatch.setenv("NINFER_KERNELS_OFF", "fp8_tc,bf16_gemv")
    assert not dispatch.use_cuda_kernels(fake_cuda, "bf16_gemv")
    monkeypatch.delenv("NINFER_KERNELS_OFF")
    monkeypatch.setenv("NINFER_KERNELS", "torch")
    assert not dispatch.use_cuda_kernels(fake_cuda, "bf16_gemv")


def test_source_instances_match_the_launcher() -> None:
    """The .cu's launch bounds and the launcher's U table agree on the row-count split the
    registers were checked for (1-2 / 3-4 / 5-8 rows), and the warp count is the same."""
    source = (runtime.KERNEL_DIR / "bf16_gemv" / "bf16_gemv.cu").read_text()
    assert "__launch_bounds__(256, M <= 2 ? 4 : M <= 4 ? 3 : 2)" in source
    assert f"constexpr int BF16_GEMV_WARPS = {bf16_cuda.WARPS};" in source
    assert bf16_cuda.THREADS == 256
    assert all(bf16_cuda.UNROLL[m] == (2 if m <= 4 else 1) for m in range(1, 9))


@pytest.mark.parametrize(
    ("on", "off", "want"),
    [
        ("", "", 2),
        ("gemv_prefetch", "", 3),
        ("", "gemv_early_loads", 0),
        ("gemv_prefetch", "gemv_early_loads", 1),
    ],
)
def test_launch_options_follow_the_switches(
    monkeypatch: pytest.MonkeyPatch, on: str, off: str, want: int
) -> None:
    """Early loads are on unless switched off, the L2 prefetch opt-in; the bits are the .cu's."""
    monkeypatch.setenv("NINFER_KERNELS_ON", on)
    monkeypatch.setenv("NINFER_KERNELS_OFF", off)
    assert bf16_cuda.launch_options() == want
    source = (runtime.KERNEL_DIR / "bf16_gemv" / "bf16_gemv.cu").read_text()
    assert f"constexpr int BF16_GEMV_L2_PREFETCH = {bf16_cuda.OPTION_L2_PREFETCH};" in source
    assert f"constexpr int BF16_GEMV_EARLY_LOADS = {bf16_cuda.OPTION_EARLY_LOADS};" in source


@pytest.mark.parametrize(
    ("form", "instance", "out_cols"),
    [
        ("plain", "bf16_gemv<1, 4, 2>", 34816),
        ("swiglu_out", "bf16_gemv<1, 4, 2, 0, true>", 17408),
        ("swiglu_in", "bf16_gemv<1, 4, 2, 1>", 34816),
    ],
)
def test_launches_on_mocked_kernels(
    monkeypatch: pytest.MonkeyPatch, form: str, instance: str, out_cols: int
) -> None:
    """The launcher with the device checks and launches stubbed (the 27B's gate-up shape, 132
    SMs): the instance and grid each form picks, as many arguments as the kernel has parameters,
    the weight's N and K where the kernel reads them, and the output's shape."""
    calls: list[tuple] = []
    monkeypatch.delenv("NINFER_KERNELS_ON", raising=False)
    monkeypatch.setattr(runtime, "check_cuda", lambda *t: torch.device("cpu"))
    monkeypatch.setattr(runtime, "num_sms", lambda device: 132)
    monkeypatch.setattr(runtime, "get_kernel", lambda op, inst, device, headers=(): inst)
    monkeypatch.setattr(runtime, "launch", lambda *a, **kw: calls.append(a))
    monkeypatch.setattr(bf16_cuda, "_problem", lambda x, w, swiglu_input=False: None)
    bf16 = torch.bfloat16
    w = torch.zeros(34816, 5120, dtype=bf16)
    if form == "plain":
        out = bf16_cuda.bf16_linear(torch.zeros(1, 5120, dtype=bf16), w)
    elif form == "swiglu_out":
        out = bf16_cuda.gate_up_swiglu(torch.zeros(1, 5120, dtype=bf16), w)
    else:
        out = bf16_cuda.bf16_linear(torch.zeros(1, 10240, dtype=bf16), w, swiglu_input=True)
    assert out.shape == (1, out_cols)
    ((kernel, grid, block, args),) = (c[:4] for c in calls)
    assert (kernel, grid, block) == (instance, (8704,), (256,))
    assert len(args) == parameter_count("bf16_gemv", "bf16_gemv")
    assert (int(args[4]), int(args[5]), int(args[6])) == (34816, 5120, 3)  # n, k, ks_log2
