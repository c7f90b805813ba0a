"""The fold launcher's per-record pointer tables (CPU: the table is plain int64 data; the
kernels themselves are in test_verify_gpu.py)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.gated_delta_verify import launch
from ninfer.kernels.gated_delta_verify.reference import FoldLayer

CPU = torch.device("cpu")


def _layer(hv: int = 4, dv: int = 8) -> FoldLayer:
    hk, dk, width, rows, slots = 2, 16, 3, 2, 3
    channels = 2 * hk * dk + hv * dv
    return FoldLayer(
        torch.zeros(slots, channels, 3),
        torch.zeros(slots, hv, dk, dv),
        torch.zeros(rows, width, channels),
        torch.zeros(rows, width, hk, dk),
        torch.zeros(rows, width, hv, dv),
        torch.zeros(rows, width, hv),
        torch.zeros(rows, width, hv),
    )


def test_table_holds_each_operands_pointers_and_is_built_once() -> None:
    layers = [_layer(), _layer()]
    table = launch._pointer_table(layers, CPU)
    order = ("ssm_state", "k", "v", "g", "beta", "conv_state", "qkv")
    assert table.shape == (7, 2)
    for j, name in enumerate(order):
        assert table[j].tolist() == [getattr(lay, name).data_ptr() for lay in layers]
    # the same tensors (a replayed graph's records): the same table, not rebuilt
    again = [FoldLayer(*lay) for lay in layers]
    assert launch._pointer_table(again, CPU) is table
    # other tensors: another table
    assert launch._pointer_table([_layer(), _layer()], CPU) is not table


def test_tables_keep_no_tensor_alive() -> None:
    """An eager round's records are fresh tensors each round: a kept table must not hold them."""
    layers = [_layer()]
    launch._pointer_table(layers, CPU)
    ref = weakref.ref(layers[0].k)
    del layers
    gc.collect()
    assert ref() is None


def test_a_dead_entry_is_not_a_hit() -> None:
    """An entry whose tensors died is rebuilt, even under the same key (ids of dead objects can
    be reused)."""
    layers = [_layer()]
    key = tuple(id(t) for lay in layers for t in lay)
    launch._TABLES[key] = ([lambda: None], torch.zeros(7, 1, dtype=torch.int64))  # a dead entry
    table = launch._pointer_table(layers, CPU)
    assert table[1].tolist() == [layers[0].k.data_ptr()]


def test_layers_that_differ_are_refused_before_a_table_is_kept() -> None:
    layers = [_layer(), _layer(hv=8)]
    with pytest.raises(rt.KernelInputError, match="differ"):
        launch._pointer_table(layers, CPU)
    key = tuple(id(t) for lay in layers for t in lay)
    assert key not in launch._TABLES


def test_tables_stay_bounded() -> None:
    kept = [[_layer()] for _ in range(launch.MAX_TABLES + 5)]
    for layers in kept:
        launch._pointer_table(layers, CPU)
    assert len(launch._TABLES) <= launch.MAX_TABLES
