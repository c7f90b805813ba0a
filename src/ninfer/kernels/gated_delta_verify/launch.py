"""CUDA launchers of the speculative verify and fold kernels (gated_delta_verify.cu).

Imports torch, kernels.runtime and the twins' types. Same signatures and results as
`reference.py`. The verify kernels run inside the round's CUDA graph, one launch per layer each;
the fold runs every linear layer in one launch per kernel (per-layer pointer arrays), eagerly,
between steps, where each launch from Python costs tens of microseconds.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.gated_delta_decode.launch import KEY_DIMS, delta_args, delta_operands
from ninfer.kernels.gated_delta_verify.reference import FoldLayer
from ninfer.kernels.gdn_decode_front import launch as front
from ninfer.kernels.gdn_decode_front.reference import DecodeFront

OP = "gated_delta_verify"
MAX_TAPS = 8  # GDV_MAX_TAPS in the .cu


def gdn_verify_front(
    qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    conv_weight: torch.Tensor,
    a_log: torch.Tensor,
    dt_bias: torch.Tensor,
    conv_state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    width: int,
    num_k_heads: int,
    head_k_dim: int,
) -> DecodeFront:
    """See `reference.gdn_verify_front` (checks and arguments shared with the decode front)."""
    num_rows, num_seqs = qkv.shape[0], state_slots.shape[0]
    if width < 1 or num_rows != num_seqs * width:
        raise rt.KernelInputError(f"{num_rows} rows are not {num_seqs} sequences x {width}")
    kw = {"num_k_heads": num_k_heads, "head_k_dim": head_k_dim}
    ops = front.front_operands(
        qkv, a, b, conv_weight, a_log, dt_bias, conv_state, state_slots, max_taps=MAX_TAPS, **kw
    )
    if num_seqs == 0:
        return ops.out
    device = qkv.device
    kernel = rt.get_kernel(OP, front.front_instance("gdn_verify_front", ops, conv_state), device)
    groups, threads = front.front_grid(ops, num_k_heads, head_k_dim)
    args = front.front_args(ops, conv_state, width=width, **kw)
    rt.launch(kernel, (groups, num_seqs), (threads,), args, device)
    return ops.out


def gated_delta_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    ssm_state: torch.Tensor,
    state_slots: torch.Tensor,
    *,
    width: int,
    scale: float,
) -> torch.Tensor:
    """See `reference.gated_delta_verify`."""
    device = rt.check_cuda(q, k, v, g, beta, ssm_state, state_slots)
    num_rows, num_seqs = q.shape[0], state_slots.shape[0]
    if width < 1 or num_rows != num_seqs * width:
        raise rt.KernelInputError(f"{num_rows} rows are not {num_seqs} sequences x {width}")
    operands = delta_operands(q, k, v, g, beta, ssm_state)
    q, v = operands[0], operands[2]
    _, num_v_heads, key_dim, value_dim = ssm_state.shape
    slots = state_slots.to(torch.int64).contiguous()
    out = torch.empty((num_rows, num_v_heads, value_dim), dtype=torch.float32, device=device)
    if num_seqs == 0:
        return out
    instance = f"gated_delta_verify<{rt.cuda_type(q, 'q')}, {rt.cuda_type(v, 'v')}, {key_dim}>"
    kernel = rt.get_kernel(OP, instance, device)
    args = delta_args(out, ssm_state, operands, slots, width=width, scale=scale)
    rt.launch(kernel, (-(-value_dim // 32), num_v_heads, num_seqs), (32, 4), args, device)
    return out


def fold_layers(
    layers: Sequence[FoldLayer],
    state_slots: torch.Tensor,
    rows: torch.Tensor,
    num_columns: torch.Tensor,
    max_columns: int,
) -> None:
    """See `reference.fold_layers` (`max_columns` is not needed here: the kernels read the
    counts on the device)."""
    del max_columns
    if not layers:
        return
    first = layers[0]
    device = rt.check_cuda(first.ssm_state, first.k, state_slots, rows, num_columns)
    num = state_slots.shape[0]
    if num == 0:
        return
    _, width, num_k_heads, key_dim = first.k.shape
    _, num_v_heads, key_dim_s, value_dim = first.ssm_state.shape
    num_channels, hist = first.conv_state.shape[1:]
    if key_dim not in KEY_DIMS or key_dim_s != key_dim or hist + 1 > MAX_TAPS:
        raise rt.KernelInputError(f"key dim {key_dim} / conv taps {hist + 1} not supported")
    qkv_stride = first.qkv.stride(1)
    slots, rows, ncols = (t.to(torch.int64).contiguous() for t in (state_slots, rows, num_columns))
    ptrs = _pointer_table(layers, device)
    num_layers = len(layers)
    delta = rt.get_kernel(OP, f"gated_delta_fold<{rt.cuda_type(first.v, 'v')}, {key_dim}>", device)
    rt.launch(
        delta,
        (-(-value_dim // 32), num_v_heads, num * num_layers),
        (32, 4),
        (
            *(rt.ptr(ptrs[j]) for j in range(5)),
            rt.ptr(slots),
            rt.ptr(rows),
            rt.ptr(ncols),
            rt.i32(num),
            rt.i32(width),
            rt.i32(num_k_heads),
            rt.i32(num_v_heads),
            rt.i32(value_dim),
        ),
        device,
    )
    conv = rt.get_kernel(OP, f"conv_fold<{rt.cuda_type(first.conv_state, 'conv')}>", device)
    threads = 256
    rt.launch(
        conv,
        (-(-num_channels // threads), num * num_layers),
        (threads,),
        (
            rt.ptr(ptrs[5]),
            rt.ptr(ptrs[6]),
            rt.i64(qkv_stride),
            rt.ptr(slots),
            rt.ptr(rows),
            rt.ptr(ncols),
            rt.i32(num),
            rt.i32(width),
            rt.i32(num_channels),
            rt.i32(hist + 1),
        ),
        device,
    )


# (tensor ids of the layers) -> (weak references to those tensors, their checked [7, L] pointer
# table on the device)
_TABLES: OrderedDict[tuple[int, ...], tuple[list[weakref.ref], torch.Tensor]] = OrderedDict()
MAX_TABLES = 64  # a round graph's records per (batch bucket, page width, parity, acceptance)


def _pointer_table(layers: Sequence[FoldLayer], device: torch.device) -> torch.Tensor:
    """The layers' operand pointers, one array per operand ([7, L] int64 on the device), checked
    and built once per set of tensors. Why: a fold runs between every two rounds, over the
    verify records a round graph holds (the same tensors each time it replays), and checking
    and copying 7 x L pointers from Python took most of the fold's host time. The entry keeps
    weak references only (an eager round's records are fresh tensors each round, ~80 MB for
    the 27B at batch 8, and must not outlive it); an entry whose tensors are all alive is
    theirs, since live objects never share an id."""
    key = tuple(id(t) for lay in layers for t in lay)
    hit = _TABLES.get(key)
    if hit is not None and all(ref() is not None for ref in hit[0]):
        _TABLES.move_to_end(key)
        return hit[1]
    first = layers[0]
    for layer in layers:
        _check_layer(layer, first)
    ptrs = torch.tensor(
        [
            [t.data_ptr() for t in (lay.ssm_state, lay.k, lay.v, lay.g, lay.beta, lay.conv_state)]
            + [lay.qkv.data_ptr()]
            for lay in layers
        ],
        dtype=torch.int64,
    )
    table = ptrs.t().contiguous().to(device)  # [7, L]: one pointer array per operand
    _TABLES[key] = ([weakref.ref(t) for lay in layers for t in lay], table)
    if len(_TABLES) > MAX_TABLES:
        _TABLES.popitem(last=False)
    return table


def _check_layer(layer: FoldLayer, first: FoldLayer) -> None:
    """Every layer must share the first one's shapes, dtypes and record layout."""
    same = all(a.shape == b.shape and a.dtype == b.dtype for a, b in zip(layer, first, strict=True))
    rec_dense = all(t.is_contiguous() for t in (layer.k, layer.v, layer.g, layer.beta))
    state_dense = layer.ssm_state.is_contiguous() and layer.conv_state.is_contiguous()
    qkv_ok = (
        layer.qkv.stride(2) == 1
        and layer.qkv.stride() == first.qkv.stride()
        and layer.qkv.stride(0) == layer.qkv.shape[1] * layer.qkv.stride(1)
    )
    if not (same and rec_dense and state_dense and qkv_ok):
        raise rt.KernelInputError("fold layers differ in shape, dtype or record layout")
    if layer.ssm_state.dtype != torch.float32 or layer.qkv.dtype != layer.conv_state.dtype:
        raise rt.KernelInputError("fold: fp32 delta state and conv records in the conv dtype")
