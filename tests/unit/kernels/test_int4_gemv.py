"""The int4 GEMV's torch twin, its launcher's refusals on the CPU, the kernel's nibble decoding
(emulated) and the shortlist head that calls it (CPU).

The independent reference is `model.lm_head_draft.dequantize_int4` (the format's own inverse,
written separately from the twin's unpacking) followed by an fp32 matmul. Inputs are fresh random
draws per run (the seed is in each failure message); comparisons are to fp32 rounding, except
the head's proposals, which run the twin itself on the CPU and so equal its argmax exactly.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from ninfer.kernels import dispatch, runtime
from ninfer.kernels.int4_gemv import launch as int4_cuda
from ninfer.kernels.int4_gemv import reference as int4_ref
from ninfer.model.lm_head_draft import (
    FUSED_MAX_ROWS,
    ShortlistHead,
    dequantize_int4,
    quantize_int4,
)


@pytest.fixture
def seed() -> int:
    return torch.seed() % 2**31


def _operands(rows: int, hidden: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    packed = torch.randint(0, 256, (rows, hidden // 2), dtype=torch.uint8, generator=g)
    scale = torch.rand(rows, hidden // 64, generator=g) * 0.05 + 1e-3
    return packed, scale


def test_unpacking_follows_the_format() -> None:
    # byte 0x8F: element 0 (low nibble) 15 - 8 = 7, element 1 (high nibble) 8 - 8 = 0
    packed = torch.tensor([[0x8F, 0x07] + [0x88] * 30], dtype=torch.uint8)
    q = int4_ref.unpack_int4(packed)
    assert q.shape == (1, 64) and q.dtype == torch.int8
    assert q[0, :4].tolist() == [7, 0, -1, -8] and (q[0, 4:] == 0).all()
    scale = torch.tensor([[0.5]])
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 3] = 2.0, 1.0
    assert int4_ref.int4_linear(x, packed, scale).item() == (7 * 2 - 8 * 1) * 0.5


@pytest.mark.parametrize("rows", [1, 3, 8, 21])
@pytest.mark.parametrize("hidden,num_out", [(64, 5), (256, 300), (640, 97)])
def test_twin_equals_dequantize_then_matmul(rows: int, hidden: int, num_out: int, seed) -> None:
    g = torch.Generator().manual_seed(seed)
    packed, scale = _operands(num_out, hidden, g)
    x = torch.randn(rows, hidden, generator=g)
    want = x @ dequantize_int4(packed, scale, torch.float32).T
    got = int4_ref.int4_linear(x, packed, scale)
    assert got.dtype == torch.float32 and got.shape == (rows, num_out)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=f"seed {seed}")
    # the twin's own fp32 dequantization is the model's, bit for bit
    assert torch.equal(
        int4_ref.dequantize(packed, scale), dequantize_int4(packed, scale, torch.float32)
    )
    # bf16 x is converted exactly: the same as the fp32 call on the converted values
    xb = x.to(torch.bfloat16)
    assert torch.equal(
        int4_ref.int4_linear(xb, packed, scale), int4_ref.int4_linear(xb.float(), packed, scale)
    )
    # dispatch on CPU tensors runs the twin, any number of rows
    assert torch.equal(dispatch.int4_linear(x, packed, scale), got)


def test_twin_refuses_mismatched_shapes() -> None:
    packed, scale = _operands(4, 128, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="int4_linear"):
        int4_ref.int4_linear(torch.randn(2, 64), packed, scale)


def test_launcher_refuses_cpu_tensors_and_off_format_operands() -> None:
    packed, scale = _operands(16, 128, torch.Generator().manual_seed(0))
    x = torch.randn(2, 128)
    assert not int4_cuda.supports(x, packed, scale)
    with pytest.raises(runtime.KernelInputError, match="CUDA device"):
        int4_cuda.int4_linear(x, packed, scale)
    # the format checks come before the device check, so their messages show on the CPU too
    problem = int4_cuda._problem
    assert "1..8" in problem(torch.randn(9, 128), packed, scale)
    assert "multiple of the scale group" in problem(torch.randn(1, 96), packed[:, :48], scale)
    assert "scale must be float32" in problem(x, packed, scale.double())
    assert "packed must be uint8" in problem(x, packed[:, :32], scale)
    assert "dtype" in problem(x.half(), packed, scale)


def _emulate_decode(mask: int, mul: float | None, add: float) -> np.ndarray:
    """The kernel's decode of nibble `mask` for stored values 0..15, in numpy fp32: the masked
    nibble or-ed into the bits of 2^23, then `* mul + add` (both exact here, so equal to fmaf)
    or `+ add` where the kernel subtracts directly."""
    stored = np.arange(16, dtype=np.uint32)
    shift = (mask & -mask).bit_length() - 1
    bits = ((stored << np.uint32(shift)) & np.uint32(mask)) | np.uint32(0x4B000000)
    f = bits.view(np.float32)
    if mul is not None:
        f = f * np.float32(mul)
    return f + np.float32(add)


def test_kernel_nibble_decode_is_exact() -> None:
    """Each decode line of int4_gemv.cu (constants read from the source) yields q = n - 8."""
    source = (runtime.KERNEL_DIR / "int4_gemv" / "int4_gemv.cu").read_text()
    pattern = re.compile(
        r"__uint_as_float\(\(v & (0x[0-9a-f]+)u\) \| 0x4b000000u\)"
        r"(?:, ([0-9.]+)f, (-[0-9.]+)f\)| - ([0-9.]+)f)"
    )
    lines = pattern.findall(source)
    assert len(lines) == 4
    for mask, mul, add, sub in lines:
        got = _emulate_decode(int(mask, 16), float(mul) if mul else None, float(add or f"-{sub}"))
        assert got.tolist() == list(range(-8, 8)), mask


def test_shortlist_on_cpu_proposes_the_twins_argmax(seed) -> None:
    g = torch.Generator().manual_seed(seed)
    lm_head = torch.randn(700, 128, generator=g)
    head = ShortlistHead(lm_head, num_sampleable=650, size=512)
    assert head.weight is None and not head.fused  # no dequantized copy on the CPU
    packed, scale = quantize_int4(lm_head[:512])
    assert torch.equal(head.packed, packed) and torch.equal(head.scale, scale)
    for rows in (1, 8, 20):
        hidden = torch.randn(rows, 128, generator=g)
        want = int4_ref.int4_linear(hidden, packed, scale).argmax(-1)
        assert torch.equal(head.propose(hidden), want), f"seed {seed}"
        bf16 = hidden.to(torch.bfloat16)
        want = int4_ref.int4_linear(bf16, packed, scale).argmax(-1)
        assert torch.equal(head.propose(bf16), want), f"seed {seed}"


def test_shortlist_routes_proposals_by_row_count(monkeypatch) -> None:
    """As on a GPU with the kernel (fused, dequantized rows kept): proposals of at most
    FUSED_MAX_ROWS rows take the int4 GEMV, larger ones F.linear over the kept rows (measured
    faster from ~5 rows up). The int4 call is recorded to tell the paths apart."""
    g = torch.Generator().manual_seed(3)
    lm_head = torch.randn(300, 128, generator=g)
    head = ShortlistHead(lm_head, num_sampleable=300, size=256)
    head.fused = True
    head.weight = dequantize_int4(head.packed, head.scale, torch.float32)
    calls: list[int] = []
    real = dispatch.int4_linear

    def recording(x, packed, scale):
        calls.append(x.shape[0])
        return real(x, packed, scale)

    monkeypatch.setattr(dispatch, "int4_linear", recording)
    for rows in (1, FUSED_MAX_ROWS, FUSED_MAX_ROWS + 1, 64):
        hidden = torch.randn(rows, 128, generator=g)
        ids = head.propose(hidden)
        if rows <= FUSED_MAX_ROWS:
            assert calls.pop() == rows
            twin = int4_ref.int4_linear(hidden, head.packed, head.scale)
            assert torch.equal(ids, twin.argmax(-1))
        else:
            assert not calls
            assert torch.equal(ids, (hidden @ head.weight.T).argmax(-1))


@pytest.mark.parametrize("serves_all", [False, True])
def test_shortlist_with_the_tensor_core_kernel_serving_every_row_count(
    serves_all: bool, monkeypatch
) -> None:
    """As on a GPU where the tensor-core int4 kernel takes the head's dtype: with
    MMA_SERVES_ALL_ROWS the head sends every proposal to the int4 kernel and keeps no
    dequantized copy; without it (the default until measured) routing is unchanged and the copy
    is kept. Availability is faked (CPU tensors); the twin computes the recorded calls."""
    import ninfer.model.lm_head_draft as draft

    assert draft.MMA_SERVES_ALL_ROWS is True  # the default since run V1 measured the kernel
    monkeypatch.setattr(draft, "MMA_SERVES_ALL_ROWS", serves_all)
    monkeypatch.setattr(dispatch, "int4_linear_available", lambda *a: True)
    monkeypatch.setattr(dispatch, "int4_mma_available", lambda *a: True)
    calls: list[int] = []

    def recording(x, packed, scale):
        calls.append(x.shape[0])
        return int4_ref.int4_linear(x, packed, scale)

    monkeypatch.setattr(dispatch, "int4_linear", recording)
    g = torch.Generator().manual_seed(5)
    lm_head = torch.randn(300, 128, generator=g).to(torch.bfloat16)
    head = ShortlistHead(lm_head, num_sampleable=300, size=256)
    assert head.fused and head.all_rows is serves_all
    assert (head.weight is None) is serves_all
    for rows in (1, FUSED_MAX_ROWS, FUSED_MAX_ROWS + 1, 9, 64, 100):
        hidden = torch.randn(rows, 128, generator=g).to(torch.bfloat16)
        ids = head.propose(hidden)
        if serves_all or rows <= FUSED_MAX_ROWS:
            assert calls.pop() == rows
            twin = int4_ref.int4_linear(hidden, head.packed, head.scale)
            assert torch.equal(ids, twin.argmax(-1))
        else:
            assert not calls


@pytest.mark.parametrize("routed", [False, True])
def test_dispatch_asks_for_tensor_cores_only_once_routed(routed: bool, monkeypatch) -> None:
    """dispatch passes tensor_cores=True to the launcher only with MMA_ROUTED, from MMA_MIN_ROWS
    rows, and without `int4_mma` in NINFER_KERNELS_OFF."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    monkeypatch.setattr(int4_cuda, "MMA_ROUTED", routed)
    monkeypatch.setattr(dispatch, "use_cuda_kernels", lambda t, op=None: op == "int4_gemv")
    seen: list[bool] = []
    monkeypatch.setattr(int4_cuda, "supports", lambda x, p, s, tensor_cores=True: True)
    monkeypatch.setattr(
        int4_cuda,
        "int4_linear",
        lambda x, p, s, tensor_cores=True: seen.append(tensor_cores) or torch.zeros(1),
    )
    packed = torch.zeros(4, 64, dtype=torch.uint8)
    scale = torch.ones(4, 2)
    x = torch.zeros(2, 128, dtype=torch.bfloat16)
    dispatch.int4_linear(x, packed, scale)
    dispatch.int4_linear(x[:1], packed, scale)  # one row: CUDA cores (faster there)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "int4_mma")
    dispatch.int4_linear(x, packed, scale)
    assert seen == [routed, False, False]
