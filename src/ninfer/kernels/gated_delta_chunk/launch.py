"""CUDA launcher of the chunked gated-delta prefill: `gdc_prepare`, then `gdc_recur`.

Imports torch, kernels.runtime and the conv launcher's offsets helper. Same signature and
semantics as `gated_delta_prefill.launch.gated_delta_prefill` (dispatch swaps the two), with the
chunk kernel's precision: q, k and v enter the tensor cores as bf16 (fp32 inputs are rounded to
bf16 first), so results match the exact rule within bf16 operand rounding (docs/kernels.md), while
the state stays fp32. `supports` names the inputs it takes; `plan` builds both launches without
touching a GPU, so their arguments can be checked on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.causal_conv1d.launch import device_cu_seqlens
from ninfer.kernels.gated_delta_chunk.reference import CHUNK, L2_EPS, ChunkTerms

OP = "gated_delta_chunk"
KEY_DIMS = (64, 128)
WARPS = 4  # gdc_recur: warps per block, 16 value columns each
COLS_PER_BLOCK = 16 * WARPS
PREP_THREADS = 128  # GDC_PREP_THREADS
MAX_GRID_YZ = 65535
# dispatch takes this kernel when a prefill's longest sequence has at least this many tokens:
# on the H200 (27B layer, eager) the token-serial kernel took 0.102 / 0.174 ms at 64 / 256
# tokens and this one 0.138 / 0.143 ms, so they cross near 160 (docs/perf.md)
CHUNK_MIN_TOKENS = 160


@dataclass(frozen=True)
class Launch:
    """One kernel launch: template instance, grid, block, packed arguments, dynamic smem bytes."""

    instance: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple[Any, ...]
    shared_mem: int


@dataclass(frozen=True)
class Plan:
    """Both launches of one call, the output, phase 1's buffers (as the twin's `ChunkTerms`: attn
    and tbeta bf16, scales fp32) and every tensor the launches' arguments point into."""

    out: torch.Tensor
    terms: ChunkTerms
    launches: tuple[Launch, ...]
    keep_alive: tuple[torch.Tensor, ...]


def stage_bytes(key_dim: int, warps: int = WARPS) -> int:
    """sizeof(GdcStage<DK, WARPS>) in gated_delta_chunk.cu: one chunk in shared memory."""
    rows = CHUNK * 2  # bf16 bytes per element, 64 rows
    return rows * (2 * (key_dim + 8) + 2 * (CHUNK + 8) + 16 * warps + 8) + CHUNK * 16


def supports(q: torch.Tensor, v: torch.Tensor, ssm_state: torch.Tensor) -> bool:
    """Whether the chunk kernel takes these shapes (else the token-serial kernel runs)."""
    if q.dim() != 3 or v.dim() != 3 or ssm_state.dim() != 4:
        return False
    key_dim, value_dim = q.shape[2], v.shape[2]
    return (
        key_dim in KEY_DIMS
        and value_dim % 16 == 0
        and value_dim > 0
        and q.dtype in rt.CUDA_TYPES
        and ssm_state.dtype == torch.float32
        and ssm_state.is_contiguous()
    )


def _bf16_heads(t: torch.Tensor) -> torch.Tensor:
    """[T, H, D] bf16 whose rows cp.async can read in 16-byte pieces in place, else a dense copy."""
    t = t.to(torch.bfloat16)
    in_place = (
        t.stride(2) == 1
        and t.stride(1) == t.shape[2]
        and t.stride(0) % 8 == 0
        and t.data_ptr() % 16 == 0
    )
    return t if in_place else t.contiguous()


def _columns(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    t = t.to(dtype)
    return t if t.stride(1) == 1 else t.contiguous()


def plan(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    query_lens: tuple[int, ...],
    *,
    scale: float,
    cu_seqlens: torch.Tensor | None = None,
) -> Plan:
    """Check the inputs, allocate the phase-1 buffers and pack both launches (any device)."""
    device = q.device
    num_tokens, num_k_heads, key_dim = q.shape
    _, num_v_heads, key_dim_s, value_dim = ssm_state.shape
    num_seqs = len(query_lens)
    if key_dim not in KEY_DIMS or key_dim_s != key_dim:
        raise rt.KernelInputError(f"key dim {key_dim} (state {key_dim_s}) not in {KEY_DIMS}")
    if value_dim % 16 or value_dim == 0:
        raise rt.KernelInputError(f"value dim {value_dim} is not a positive multiple of 16")
    if k.shape != q.shape or v.shape != (num_tokens, num_v_heads, value_dim):
        raise rt.KernelInputError(
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match the state"
        )
    gate_shape = (num_tokens, num_v_heads)
    if num_v_heads % num_k_heads or a.shape != gate_shape or b.shape != gate_shape:
        raise rt.KernelInputError("a and b must be [T, Hv] with Hv a multiple of Hk")
    if a_log.shape != (num_v_heads,) or dt_bias.shape != (num_v_heads,):
        raise rt.KernelInputError("A_log and dt_bias must be [Hv]")
    if ssm_state.dtype != torch.float32 or not ssm_state.is_contiguous():
        raise rt.KernelInputError("ssm_state must be a contiguous float32 tensor")
    if sum(query_lens) != num_tokens or state_slots.shape != (num_seqs,):
        raise rt.KernelInputError(
            f"query_lens {query_lens} and slots {tuple(state_slots.shape)} != {num_tokens} tokens"
        )
    if num_v_heads > MAX_GRID_YZ or num_seqs > MAX_GRID_YZ:
        raise rt.KernelInputError(f"{num_v_heads} heads x {num_seqs} sequences exceed the grid")
    gate_type = rt.cuda_type(q, "q")  # a, b keep the input precision; q, k, v become bf16
    gate_dtype = q.dtype
    q, k, v = (_bf16_heads(t) for t in (q, k, v))
    a, b = _columns(a, gate_dtype), _columns(b, gate_dtype)
    a_log = a_log.float().contiguous()
    dt_bias = dt_bias.float().contiguous()
    slots = state_slots.to(device=device, dtype=torch.int64).contiguous()
    offsets = device_cu_seqlens(query_lens, cu_seqlens, device)
    out = torch.empty((num_tokens, num_v_heads, value_dim), dtype=torch.float32, device=device)
    attn = torch.empty((num_tokens, num_v_heads, CHUNK), dtype=torch.bfloat16, device=device)
    tbeta = torch.empty_like(attn)
    scales = torch.empty((num_tokens, num_v_heads, 4), dtype=torch.float32, device=device)
    keep = (q, k, v, a, b, a_log, dt_bias, slots, offsets, out, attn, tbeta, scales, ssm_state)
    max_chunks = max((-(-n // CHUNK) for n in query_lens), default=0)
    terms = ChunkTerms(attn, tbeta, scales)
    if num_seqs == 0 or num_tokens == 0:
        return Plan(out, terms, (), keep)
    prepare = Launch(
        f"gdc_prepare<{gate_type}, {key_dim}>",
        (max_chunks, num_k_heads, num_seqs),
        (PREP_THREADS, 1, 1),
        (
            rt.ptr(attn),
            rt.ptr(tbeta),
            rt.ptr(scales),
            rt.ptr(q),
            rt.i64(q.stride(0)),
            rt.ptr(k),
            rt.i64(k.stride(0)),
            rt.ptr(a),
            rt.i64(a.stride(0)),
            rt.ptr(b),
            rt.i64(b.stride(0)),
            rt.ptr(a_log),
            rt.ptr(dt_bias),
            rt.ptr(offsets),
            rt.i32(num_k_heads),
            rt.i32(num_v_heads),
            rt.f32(scale),
            rt.f32(L2_EPS),
        ),
        0,
    )
    recur = Launch(
        f"gdc_recur<{key_dim}, {WARPS}>",
        (-(-value_dim // COLS_PER_BLOCK), num_v_heads, num_seqs),
        (32 * WARPS, 1, 1),
        (
            rt.ptr(out),
            rt.ptr(ssm_state),
            rt.ptr(q),
            rt.i64(q.stride(0)),
            rt.ptr(k),
            rt.i64(k.stride(0)),
            rt.ptr(v),
            rt.i64(v.stride(0)),
            rt.ptr(attn),
            rt.ptr(tbeta),
            rt.ptr(scales),
            rt.ptr(slots),
            rt.ptr(offsets),
            rt.i32(num_k_heads),
            rt.i32(num_v_heads),
            rt.i32(value_dim),
        ),
        2 * stage_bytes(key_dim),
    )
    return Plan(out, terms, (prepare, recur), keep)


def gated_delta_chunk_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    query_lens: tuple[int, ...],
    *,
    scale: float,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """See `gated_delta_prefill.reference.gated_delta_prefill` (and the precision note above)."""
    device = rt.check_cuda(q, k, v, a, b, a_log, dt_bias, ssm_state, state_slots)
    p = plan(
        q, k, v, a, b, a_log, dt_bias, ssm_state, state_slots, query_lens,
        scale=scale, cu_seqlens=cu_seqlens,
    )  # fmt: skip
    index = device.index if device.index is not None else torch.cuda.current_device()
    for launch in p.launches:
        kernel = rt.get_kernel(OP, launch.instance, device)
        rt.allow_shared(OP, launch.instance, index, launch.shared_mem)
        rt.launch(
            kernel, launch.grid, launch.block, launch.args, device, shared_mem=launch.shared_mem
        )
    return p.out
