"""CUDA launcher of the prefill causal conv1d (two launches: outputs, then the state slots).

Imports torch and kernels.runtime. Same signature and results as `reference.causal_conv1d`. x may
be a column slice of the fused projection output (rows strided, columns dense): it is read in
place. Kernel sizes 2-4 are instantiated; any float32/bfloat16 mix of x, state and weight runs.
"""

from __future__ import annotations

import itertools

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.switches import switched_off

OP = "causal_conv1d"
KERNEL_SIZES = (2, 3, 4)
THREADS = 128
TOKENS_PER_THREAD = 32  # CONV_TOKENS in causal_conv1d.cu
MAX_GRID_Y = 65535
WIDE_CHANNELS = 4  # channels per thread where aligned V-wide accesses fit (`channels_per_thread`)


def channels_per_thread(x: torch.Tensor) -> int:
    """The .cu's V: WIDE_CHANNELS where x's channel count, base address and row stride all allow
    aligned WIDE_CHANNELS-element loads (the fused projection's qkv columns do), else 1; either
    gives the same bits. `NINFER_KERNELS_OFF=conv_wide` keeps 1 (an A/B)."""
    v = WIDE_CHANNELS
    vec_bytes = v * x.element_size()
    if (
        switched_off("conv_wide")
        or x.shape[1] % v
        or x.data_ptr() % vec_bytes
        or (x.stride(0) * x.element_size()) % vec_bytes
    ):
        return 1
    return v


def device_cu_seqlens(
    query_lens: tuple[int, ...], cu_seqlens: torch.Tensor | None, device: torch.device
) -> torch.Tensor:
    """[B+1] int64 offsets on `device`: the caller's copy when given, else built from the host."""
    if cu_seqlens is None:
        offsets = [0, *itertools.accumulate(query_lens)]
        return torch.tensor(offsets, dtype=torch.int64, device=device)
    if cu_seqlens.shape != (len(query_lens) + 1,):
        raise rt.KernelInputError(
            f"cu_seqlens shape {tuple(cu_seqlens.shape)} != [{len(query_lens) + 1}]"
        )
    return cu_seqlens.to(device=device, dtype=torch.int64).contiguous()


def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    query_lens: tuple[int, ...],
    *,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """See `reference.causal_conv1d`."""
    device = rt.check_cuda(x, weight, conv_state, state_slots)
    num_tokens, num_channels = x.shape
    taps = weight.shape[-1]
    num_seqs = len(query_lens)
    if taps not in KERNEL_SIZES or weight.shape != (num_channels, taps):
        raise rt.KernelInputError(f"conv weight {tuple(weight.shape)} != [C, K in {KERNEL_SIZES}]")
    if conv_state.shape[1:] != (num_channels, taps - 1) or not conv_state.is_contiguous():
        raise rt.KernelInputError("conv_state must be a contiguous [S, C, K-1] tensor")
    if sum(query_lens) != num_tokens or state_slots.shape != (num_seqs,):
        raise rt.KernelInputError(
            f"query_lens {query_lens} and slots {tuple(state_slots.shape)} != {num_tokens} tokens"
        )
    num_tiles = -(-num_tokens // TOKENS_PER_THREAD)
    if num_tiles > MAX_GRID_Y or num_seqs > MAX_GRID_Y:
        raise rt.KernelInputError(f"{num_tokens} tokens in {num_seqs} sequences exceed the grid")
    if x.stride(1) != 1:
        x = x.contiguous()
    weight = weight.contiguous()
    slots = state_slots.to(torch.int64).contiguous()
    offsets = device_cu_seqlens(query_lens, cu_seqlens, device)
    out = torch.empty((num_tokens, num_channels), dtype=x.dtype, device=device)
    if num_tokens == 0:
        return out
    tx = rt.cuda_type(x, "x")
    ts = rt.cuda_type(conv_state, "conv_state")
    tw = rt.cuda_type(weight, "conv weight")
    v = channels_per_thread(x)
    fwd = rt.get_kernel(OP, f"causal_conv1d_fwd<{tx}, {ts}, {tw}, {taps}, {v}>", device)
    channel_blocks = -(-num_channels // THREADS)
    rt.launch(
        fwd,
        (-(-num_channels // (THREADS * v)), num_tiles),
        (THREADS,),
        (
            rt.ptr(out),
            rt.ptr(x),
            rt.i64(x.stride(0)),
            rt.ptr(conv_state),
            rt.ptr(weight),
            rt.ptr(slots),
            rt.ptr(offsets),
            rt.i32(num_seqs),
            rt.i64(num_tokens),
            rt.i32(num_channels),
        ),
        device,
    )
    # Stream-ordered after the outputs: every old state has been read before any slot changes.
    update = rt.get_kernel(OP, f"causal_conv1d_state<{tx}, {ts}, {taps}>", device)
    rt.launch(
        update,
        (channel_blocks, num_seqs),
        (THREADS,),
        (
            rt.ptr(conv_state),
            rt.ptr(x),
            rt.i64(x.stride(0)),
            rt.ptr(slots),
            rt.ptr(offsets),
            rt.i32(num_channels),
        ),
        device,
    )
    return out
