"""The prefill causal-conv1d twin against a plain tap-by-tap conv, and its launcher's checks (CPU).

Fresh random inputs per seed; varlen batches include 1-token sequences and sequences shorter than
K-1 (whose new state mixes old state and new inputs). Slots no sequence names are NaN-poisoned and
must come back untouched.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ninfer.kernels import dispatch, runtime
from ninfer.kernels.causal_conv1d import launch
from ninfer.kernels.causal_conv1d.reference import causal_conv1d

BATCHES = [(1,), (2,), (9,), (4, 1, 2, 9), (1, 1, 1), (3, 40, 1)]


def plain_conv(x: torch.Tensor, weight: torch.Tensor, history: torch.Tensor):
    """One sequence: silu(sum_j w_j ext[t + j]) over ext = [history, x], and the new history."""
    taps = weight.shape[1]
    ext = torch.cat((history.double().T, x.double()))  # [K-1+n, C]
    ys = []
    for t in range(x.shape[0]):
        ys.append(sum(ext[t + j] * weight[:, j].double() for j in range(taps)))
    y = torch.stack(ys) if ys else ext[:0]
    return F.silu(y), ext[ext.shape[0] - (taps - 1) :].T


def _case(seed: int, lens: tuple[int, ...], channels: int, taps: int, dtype, state_dtype):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lens), channels, generator=gen).to(dtype)
    weight = (torch.randn(channels, taps, generator=gen) * 0.5).to(dtype)
    num_slots = len(lens) + 2
    state = torch.randn(num_slots, channels, taps - 1, generator=gen).to(state_dtype)
    slots = torch.randperm(num_slots, generator=gen)[: len(lens)]
    unused = sorted(set(range(num_slots)) - set(slots.tolist()))
    state[unused] = float("nan")
    return x, weight, state, slots, unused


@pytest.mark.parametrize("lens", BATCHES, ids=str)
@pytest.mark.parametrize("taps", [4, 3, 2])
@pytest.mark.parametrize(
    "dtype,state_dtype",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float32),
    ],
    ids=["fp32", "bf16", "bf16-x-fp32-state"],
)
def test_twin_matches_plain_conv(lens, taps, dtype, state_dtype) -> None:
    x, weight, state, slots, unused = _case(len(lens) * 7 + taps, lens, 6, taps, dtype, state_dtype)
    before = state.clone()
    got = causal_conv1d(x, weight, state, slots, lens)
    assert got.shape == x.shape and got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    start = 0
    for i, n in enumerate(lens):
        slot = int(slots[i])
        want, history = plain_conv(
            x[start : start + n].float(), weight.float(), before[slot].float()
        )
        torch.testing.assert_close(got[start : start + n].double(), want, rtol=tol, atol=tol)
        # the last K-1 inputs, exactly (older ones from the old state when n < K-1)
        assert torch.equal(state[slot], history.to(state_dtype))
        start += n
    assert state[unused].isnan().all()


def test_strided_rows_read_like_a_dense_copy() -> None:
    """x as a column slice of a wider projection output, as the model passes it."""
    gen = torch.Generator().manual_seed(11)
    lens = (5, 2, 12)
    proj = torch.randn(sum(lens), 30, generator=gen)
    x = proj[:, 3:21]
    assert not x.is_contiguous()
    weight = torch.randn(18, 4, generator=gen)
    state = torch.randn(4, 18, 3, generator=gen)
    slots = torch.tensor([2, 0, 3])
    dense_state = state.clone()
    got = causal_conv1d(x, weight, state, slots, lens)
    want = causal_conv1d(x.contiguous(), weight, dense_state, slots, lens)
    assert torch.equal(got, want) and torch.equal(state, dense_state)


def test_dispatch_runs_the_twin_on_cpu() -> None:
    x, weight, state, slots, _ = _case(3, (4, 1, 6), 8, 4, torch.float32, torch.float32)
    theirs = state.clone()
    cu = torch.tensor([0, 4, 5, 11])
    got = dispatch.causal_conv1d(x, weight, state, slots, (4, 1, 6), cu_seqlens=cu)
    assert torch.equal(got, causal_conv1d(x, weight, theirs, slots, (4, 1, 6)))
    torch.testing.assert_close(state, theirs, rtol=0, atol=0, equal_nan=True)


def test_offsets_come_from_the_host_lengths_or_the_callers_copy() -> None:
    cpu = torch.device("cpu")
    built = launch.device_cu_seqlens((3, 1, 2), None, cpu)
    assert built.dtype == torch.int64 and built.tolist() == [0, 3, 4, 6]
    given = launch.device_cu_seqlens((3, 1, 2), torch.tensor([0, 3, 4, 6], dtype=torch.int32), cpu)
    assert given.dtype == torch.int64 and given.tolist() == [0, 3, 4, 6]
    with pytest.raises(runtime.KernelInputError, match="cu_seqlens"):
        launch.device_cu_seqlens((3, 1, 2), torch.tensor([0, 3, 4]), cpu)


def test_launcher_refuses_cpu_tensors() -> None:
    x, weight, state, slots, _ = _case(5, (3,), 4, 4, torch.float32, torch.float32)
    with pytest.raises(runtime.KernelInputError, match="CUDA"):
        launch.causal_conv1d(x, weight, state, slots, (3,))


def test_channels_per_thread_needs_aligned_rows(monkeypatch) -> None:
    """Four channels per thread only where every 4-wide access is aligned; the switch keeps 1."""
    monkeypatch.delenv("NINFER_KERNELS_OFF", raising=False)
    proj = torch.zeros(8, 16480, dtype=torch.bfloat16)
    assert launch.channels_per_thread(proj[:, :10240]) == 4  # the 27B's qkv columns
    assert launch.channels_per_thread(proj[:, 2:10242]) == 1  # base off the 8-byte grid
    assert launch.channels_per_thread(proj.view(-1)[: 8 * 1030].view(8, 1030)[:, :1028]) == 1
    assert launch.channels_per_thread(proj[:, :10238]) == 1  # channels not a multiple of 4
    monkeypatch.setenv("NINFER_KERNELS_OFF", "conv_wide")
    assert launch.channels_per_thread(proj[:, :10240]) == 1
