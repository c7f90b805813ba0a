"""Programmatic dependent launch (PDL) of ninfer kernels on Hopper and later.

Why: a 27B decode step is ~800 short kernels. In plain stream order each one's blocks are
scheduled only after its predecessor has completed, so every boundary pays the launch latency
and the predecessor's drain (its last, partly idle wave). Launched with the programmatic stream
serialization attribute, a kernel's blocks are scheduled as soon as every block of its
predecessor has triggered (each ninfer kernel triggers at its start: `pdl_begin` in common.cu)
and wait in `griddepcontrol.wait` until the predecessor has completed and its writes are
visible; inside a CUDA graph the attribute becomes a programmatic edge. A kernel after a
non-ninfer one (cuBLAS, torch) still waits for it to complete: the predecessor never triggers
early, and the wait is at the top of every kernel.

CuPy launches without attributes, so this calls the driver's `cuLaunchKernelEx` through ctypes
with the same arguments CuPy would pack. Off where `pdl` is in NINFER_KERNELS_OFF, below
sm_90, or where the driver lacks the entry point.

Imports numpy and kernels.switches only (kernels.runtime imports this).
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from ninfer.kernels import switches

_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID
_CLUSTER_SCHEDULING_POLICY_PREFERENCE = 5  # CUlaunchAttributeID
_LOAD_BALANCING = 2  # CUclusterSchedulingPolicy (0 default, 1 spread)


class _AttributeValue(ctypes.Union):
    _fields_ = [("flag", ctypes.c_int), ("align", ctypes.c_uint64), ("pad", ctypes.c_char * 64)]


class _Attribute(ctypes.Structure):  # CUlaunchAttribute
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttributeValue)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("grid_x", ctypes.c_uint),
        ("grid_y", ctypes.c_uint),
        ("grid_z", ctypes.c_uint),
        ("block_x", ctypes.c_uint),
        ("block_y", ctypes.c_uint),
        ("block_z", ctypes.c_uint),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attribute)),
        ("num_attrs", ctypes.c_uint),
    ]


_ATTRIBUTE = _Attribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
_ATTRIBUTE.value.flag = 1
# PDL plus the load-balancing cluster placement, for thread-block-cluster kernels under the
# opt-in `cluster_balance` switch (runtime.launch): the default policy spreads a cluster's
# blocks over distinct SMs of one GPC, which leaves slots no whole cluster fits (ncu on the fp8
# ring GEMV's 4-block clusters, run S45A: 92 resident clusters, 368 of the 396 block slots).
_BALANCED = (_Attribute * 2)(
    _Attribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION),
    _Attribute(id=_CLUSTER_SCHEDULING_POLICY_PREFERENCE),
)
_BALANCED[0].value.flag = 1
_BALANCED[1].value.flag = _LOAD_BALANCING

_SCALARS = {
    np.dtype(np.uint64): ctypes.c_uint64,
    np.dtype(np.int64): ctypes.c_int64,
    np.dtype(np.uint32): ctypes.c_uint32,
    np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.float32): ctypes.c_float,
    np.dtype(np.float64): ctypes.c_double,
    np.dtype(np.bool_): ctypes.c_bool,
}


def switched_off() -> bool:
    """`pdl` in NINFER_KERNELS_OFF."""
    return switches.switched_off("pdl")


@functools.cache
def _driver() -> Any:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        entry = lib.cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    entry.restype = ctypes.c_int
    entry.argtypes = [
        ctypes.POINTER(_Config),
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_void_p,
    ]
    lib.cuGetErrorName.restype = ctypes.c_int
    lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    return lib


@functools.cache
def _capable(device_index: int) -> bool:
    import torch

    return torch.cuda.get_device_capability(device_index)[0] >= 9 and _driver() is not None


def enabled(device_index: int) -> bool:
    """Whether launches on this device go through `launch` (sm_90+, driver entry, not off)."""
    return not switched_off() and _capable(device_index)


def param(value: Any) -> ctypes._SimpleCData:
    """One kernel argument as the C value CuPy would pass: numpy scalars keep their type, Python
    ints are int64, floats double, bools bool, tensors their device address."""
    if isinstance(value, np.generic):
        try:
            return _SCALARS[value.dtype](value.item())
        except KeyError:
            raise TypeError(f"kernel argument of dtype {value.dtype} is not supported") from None
    if isinstance(value, bool):
        return ctypes.c_bool(value)
    if isinstance(value, int):
        return ctypes.c_int64(value)
    if isinstance(value, float):
        return ctypes.c_double(value)
    if hasattr(value, "data_ptr"):
        return ctypes.c_uint64(value.data_ptr())
    raise TypeError(f"kernel argument {type(value).__name__} is not supported")


def launch(
    kernel: Any,
    grid: Sequence[int],
    block: Sequence[int],
    args: Sequence[Any],
    stream_ptr: int,
    shared_mem: int,
    *,
    balance_clusters: bool = False,
) -> None:
    """cuLaunchKernelEx of a CuPy kernel (RawKernel or Function) with the PDL attribute, on the
    raw CUDA stream `stream_ptr`, in the current device's context; `balance_clusters` adds the
    load-balancing cluster scheduling preference (cluster kernels only)."""
    lib = _driver()
    function = getattr(kernel, "kernel", kernel)  # RawKernel -> its loaded Function
    params = [param(a) for a in args]
    pointers = (ctypes.c_void_p * max(len(params), 1))(
        *[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in params]
    )
    grid3 = (*grid, 1, 1)[:3]
    block3 = (*block, 1, 1)[:3]
    if balance_clusters:
        attrs, count = ctypes.cast(_BALANCED, ctypes.POINTER(_Attribute)), 2
    else:
        attrs, count = ctypes.pointer(_ATTRIBUTE), 1
    config = _Config(*grid3, *block3, shared_mem, stream_ptr, attrs, count)
    err = lib.cuLaunchKernelEx(ctypes.byref(config), function.ptr, pointers, None)
    if err:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(err, ctypes.byref(name))
        label = name.value.decode() if name.value else str(err)
        raise RuntimeError(
            f"cuLaunchKernelEx failed with {label} (grid {grid3}, block {block3}, "
            f"{shared_mem} B shared); NINFER_KERNELS_OFF=pdl launches without it"
        )
