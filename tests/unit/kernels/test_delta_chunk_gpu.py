"""The chunked gated-delta prefill kernel against its torch twin and the token-serial kernel (GPU).

Tolerances (||a - b|| / ||b||, outputs and final states alike):
- against the twin that rounds as the kernel does (bf16 operands, fp32 accumulation, on CPU
  copies of the inputs): 1e-3; the two differ in fp32 summation order and the occasional bf16
  rounding that order flips;
- against the exact chunked form (fp32 throughout) and against the token-serial kernel (fp32
  state and arithmetic): 1e-2; the kernel's bf16 operands cost 2.5e-3 to 4e-3 on these inputs.
Fresh random inputs per run; q/k/v are row-strided views of a conv output and a/b columns of the
projection, as the model passes them; unnamed state slots are NaN-poisoned and must stay NaN.
"""

from __future__ import annotations

import pytest
import torch

from ninfer.kernels import dispatch
from ninfer.kernels import runtime as rt
from ninfer.kernels.gated_delta_chunk import launch as chunk_cuda
from ninfer.kernels.gated_delta_chunk import reference as chunk_ref
from ninfer.kernels.gated_delta_prefill import launch as serial_cuda
from support.gpu_checks import rel

pytestmark = pytest.mark.gpu
TWIN_TOL = 1e-3
EXACT_TOL = 1e-2


def _case(gen, lens, hk, hv, dk, dv, dtype, *, start="random", decay="mild", extra_slots=3):
    num_tokens = sum(lens)
    channels = 2 * hk * dk + hv * dv
    mixed = torch.randn(num_tokens, channels, device="cuda", generator=gen).to(dtype)
    q = mixed[:, : hk * dk].view(num_tokens, hk, dk)
    k = mixed[:, hk * dk : 2 * hk * dk].view(num_tokens, hk, dk)
    v = mixed[:, 2 * hk * dk :].view(num_tokens, hv, dv)
    proj = torch.randn(num_tokens, hv * dv + 2 * hv, device="cuda", generator=gen).to(dtype)
    b, a = proj[:, hv * dv : hv * dv + hv], proj[:, hv * dv + hv :]
    a_log = torch.rand(hv, device="cuda", generator=gen) * 2 - 1
    dt_bias = torch.randn(hv, device="cuda", generator=gen)
    if decay == "strong":  # g = -exp(A_log) softplus(a + dt): about -20 to -200 per token
        a_log = torch.full_like(a_log, 3.0)
        dt_bias = torch.full_like(dt_bias, 2.0)
    num_slots = len(lens) + extra_slots
    slots = torch.randperm(num_slots, device="cuda", generator=gen)[: len(lens)]
    unused = sorted(set(range(num_slots)) - set(slots.tolist()))
    state = torch.randn(num_slots, hv, dk, dv, device="cuda", generator=gen) * 0.5
    if start == "zero":
        state.zero_()
    state[unused] = float("nan")
    return (q, k, v, a, b, a_log, dt_bias), state, slots, unused


def _cpu(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t.to("cpu", copy=True) for t in tensors)


def _offsets(lens: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda")


# (lens, Hk, Hv, Dk, Dv)
SHAPES = [
    pytest.param((1500, 7, 1, 540), 16, 48, 128, 128, id="27b-2048-mixed"),
    pytest.param((300, 9, 1), 16, 32, 128, 128, id="35b-mixed"),
    pytest.param((1, 63, 64, 65, 127, 128, 129, 0), 2, 6, 128, 32, id="chunk-edges"),
    pytest.param((17, 64, 200), 2, 4, 64, 48, id="dk64-dv48"),
    pytest.param((90, 3), 1, 2, 128, 80, id="dv80-partial-block"),
    pytest.param((70,), 1, 1, 128, 16, id="dv16"),
]


@pytest.mark.parametrize("lens,hk,hv,dk,dv", SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("start", ["random", "zero"])
def test_chunk_kernel_matches_its_twins(lens, hk, hv, dk, dv, dtype, start, gen) -> None:
    inputs, state, slots, unused = _case(gen, lens, hk, hv, dk, dv, dtype, start=start)
    scale = dk**-0.5
    cpu_inputs, cpu_slots = _cpu(*inputs), slots.cpu()
    twin_state, exact_state = state.cpu(), state.cpu()
    twin = chunk_ref.gated_delta_chunk_prefill(
        *cpu_inputs, twin_state, cpu_slots, lens, scale=scale
    )
    exact = chunk_ref.gated_delta_chunk_prefill(
        *cpu_inputs, exact_state, cpu_slots, lens, scale=scale, operand_dtype=None
    )
    got = chunk_cuda.gated_delta_chunk_prefill(
        *inputs, state, slots, lens, scale=scale, cu_seqlens=_offsets(lens)
    )
    assert got.shape == (sum(lens), hv, dv) and got.dtype == torch.float32
    errors = {
        "out/twin": rel(got, twin),
        "out/exact": rel(got, exact),
        "state/twin": rel(state[slots], twin_state[cpu_slots]),
        "state/exact": rel(state[slots], exact_state[cpu_slots]),
    }
    assert errors["out/twin"] < TWIN_TOL and errors["state/twin"] < TWIN_TOL, errors
    assert errors["out/exact"] < EXACT_TOL and errors["state/exact"] < EXACT_TOL, errors
    assert state[unused].isnan().all()


def test_phase_one_terms_match_the_twin(gen) -> None:
    """The stored attn, Tb and row scales (27B heads) against `chunk_terms`: both bf16-rounded,
    so within 1e-2 of each other (a few bf16 ulps where fp32 sums round differently)."""
    lens = (130, 64, 1)
    inputs, state, slots, _ = _case(gen, lens, 16, 48, 128, 128, torch.bfloat16)
    plan = chunk_cuda.plan(*inputs, state, slots, lens, scale=128**-0.5)
    device = inputs[0].device
    prepare = plan.launches[0]
    rt.launch(rt.get_kernel(chunk_cuda.OP, prepare.instance, device), prepare.grid,
              prepare.block, prepare.args, device)  # fmt: skip
    attn, tbeta, scales = plan.terms
    q, k, _, a, b, a_log, dt_bias = _cpu(*inputs)
    want = chunk_ref.chunk_terms(q, k, a, b, a_log, dt_bias, lens, scale=128**-0.5)
    assert rel(attn, want.attn) < 1e-2
    assert rel(tbeta, want.tbeta) < 1e-2
    assert rel(scales, want.scales) < 1e-4  # fp32 throughout


@pytest.mark.parametrize(
    "lens",
    [
        pytest.param((512,), id="B1"),
        pytest.param((512, 512), id="B2"),
        pytest.param((700, 64, 300, 1), id="B4-mixed"),
        pytest.param((256,) * 8, id="B8"),
    ],
)
@pytest.mark.parametrize("decay", ["mild", "strong"])
def test_chunk_kernel_matches_the_serial_kernel(lens, decay, gen) -> None:
    """27B heads, batches of 1 to 8 sequences, each continuing its own state slot."""
    inputs, state, slots, unused = _case(gen, lens, 16, 48, 128, 128, torch.bfloat16, decay=decay)
    serial_state = state.clone()
    offsets = _offsets(lens)
    want = serial_cuda.gated_delta_prefill(
        *inputs, serial_state, slots, lens, scale=128**-0.5, cu_seqlens=offsets
    )
    got = chunk_cuda.gated_delta_chunk_prefill(
        *inputs, state, slots, lens, scale=128**-0.5, cu_seqlens=offsets
    )
    assert rel(got, want) < EXACT_TOL
    assert rel(state[slots], serial_state[slots]) < EXACT_TOL
    assert state[unused].isnan().all()


def test_long_prefill_in_two_pieces_matches_one_serial_pass(gen) -> None:
    """8,192 tokens (27B heads) as 3,000 + 5,192 through the chunk kernel, the second piece
    continuing from the slot the first wrote, against one token-serial pass."""
    inputs, state, slots, _ = _case(gen, (8192,), 16, 48, 128, 128, torch.bfloat16)
    serial_state = state.clone()
    want = serial_cuda.gated_delta_prefill(*inputs, serial_state, slots, (8192,), scale=0.088)
    first = tuple(t[:3000] for t in inputs[:5]) + inputs[5:]
    second = tuple(t[3000:] for t in inputs[:5]) + inputs[5:]
    got = torch.cat(
        (
            chunk_cuda.gated_delta_chunk_prefill(*first, state, slots, (3000,), scale=0.088),
            chunk_cuda.gated_delta_chunk_prefill(*second, state, slots, (5192,), scale=0.088),
        )
    )
    assert rel(got, want) < EXACT_TOL
    assert rel(state[slots], serial_state[slots]) < EXACT_TOL


def test_dispatch_takes_the_chunk_kernel_for_long_bf16_prefills(gen, monkeypatch) -> None:
    """Bit-identical to the launcher it should pick: chunked for bf16 at CHUNK_MIN_TOKENS, the
    token-serial kernel below it, for fp32, and when switched off by name."""
    n = chunk_cuda.CHUNK_MIN_TOKENS

    def both(lens, dtype, launcher):
        inputs, state, slots, _ = _case(gen, lens, 2, 4, 128, 32, dtype)
        mine = state.clone()
        got = dispatch.gated_delta_prefill(*inputs, state, slots, lens, scale=0.1)
        want = launcher(*inputs, mine, slots, lens, scale=0.1)
        return torch.equal(got, want) and torch.equal(state[slots], mine[slots])

    assert both((3, n), torch.bfloat16, chunk_cuda.gated_delta_chunk_prefill)
    assert both((3, n - 1), torch.bfloat16, serial_cuda.gated_delta_prefill)
    assert both((3, n), torch.float32, serial_cuda.gated_delta_prefill)
    monkeypatch.setenv("NINFER_KERNELS_OFF", "gated_delta_chunk")
    assert both((3, n), torch.bfloat16, serial_cuda.gated_delta_prefill)
