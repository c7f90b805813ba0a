"""CuPy runtime for ninfer kernels: NVRTC compilation, torch-stream launches, argument packing.

Imports torch, numpy, kernels.pdl, kernels.switches and (lazily, on first use) cupy. Sources
are compiled once per (op, template instance, GPU architecture) with NVRTC for the device's own
`sm_XY` (so Hopper gets sm_90 machine code, not PTX jitted from an older target); CuPy also
caches the binaries on disk. Every launch goes on torch's current stream, so kernels order with
torch ops and are recorded by `torch.cuda.graph` captures like any torch op.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ninfer.kernels import pdl, switches

KERNEL_DIR = Path(__file__).resolve().parent


class KernelUnavailable(RuntimeError):
    """CUDA kernels were asked for where CuPy or a CUDA device is missing."""


class KernelInputError(ValueError):
    """A kernel argument has a dtype, device or shape the kernel does not handle."""


@functools.cache
def cupy_available() -> bool:
    """True when CuPy imports and sees a CUDA device (cached: the answer cannot change)."""
    try:
        import cupy
    except ImportError:
        return False
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # a CuPy without a driver raises its own runtime error types
        return False


def _cupy() -> Any:
    if not cupy_available():
        raise KernelUnavailable("CUDA kernels need CuPy (pip install 'ninfer[cuda13]') and a GPU")
    import cupy

    return cupy


@functools.cache
def _module(
    op: str, name_expressions: tuple[str, ...], arch: str, headers: tuple[str, ...] = ()
) -> Any:
    cupy = _cupy()
    parts = ["common.cu", *headers, f"{op}/{op}.cu"]
    source = "".join((KERNEL_DIR / part).read_text() for part in parts)
    options = ("--std=c++17", f"--gpu-architecture={arch}", "--use_fast_math")
    return cupy.RawModule(code=source, options=options, name_expressions=name_expressions)


def _arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def get_kernel(op: str, instance: str, device: torch.device, headers: tuple[str, ...] = ()) -> Any:
    """The compiled `instance` (a template instantiation such as `f<bf16, true>`) of `op`.cu.

    `headers`: device-code files (paths under kernels/) compiled between common.cu and the op's
    source, for helpers two ops share (e.g. the KV codecs of kv_quant/kv_codec.cu).
    """
    _cupy()  # a clear error before touching the CUDA runtime
    module = _module(op, (instance,), _arch(device), headers)
    return module.get_function(instance)


SHARED_DEFAULT = 48 * 1024  # dynamic shared memory a launch may use without opting in


@functools.cache
def allow_shared(
    op: str, instance: str, device_index: int, nbytes: int, headers: tuple[str, ...] = ()
) -> None:
    """Opt `instance` of `op` in to `nbytes` of dynamic shared memory, once per device and size;
    nothing at SHARED_DEFAULT or below, which every launch may use without opting in."""
    if nbytes <= SHARED_DEFAULT:
        return
    cupy = _cupy()
    kernel = get_kernel(op, instance, torch.device("cuda", device_index), headers)
    with cupy.cuda.Device(device_index):
        kernel.max_dynamic_shared_size_bytes = nbytes


@functools.cache
def _external_stream(ptr: int, device_index: int) -> Any:
    cupy = _cupy()
    # NOTE: CuPy 14 deprecates ExternalStream for Stream.from_external, which takes an object with
    # the __cuda_stream__ protocol rather than a pointer; ExternalStream is what was checked on the
    # GPU machine (launches and graph capture, 2026-12-02), so it stays until that is re-checked.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(ptr, device_index)


def device_index(device: torch.device) -> int:
    """The CUDA ordinal of `device` ("cuda" without one: the current device)."""
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device` (cached per ordinal): what split plans fill."""
    return _sm_count(device_index(device))


def launch(
    kernel: Any,
    grid: tuple[int, ...],
    block: tuple[int, ...],
    args: Sequence[Any],
    device: torch.device,
    *,
    shared_mem: int = 0,
    clustered: bool = False,
) -> None:
    """Launch on torch's current stream of `device` (which a graph capture also records).

    `shared_mem`: bytes of dynamic shared memory (`extern __shared__`), at most 48 KiB unless
    the kernel was opted in to more (`allow_shared`).
    On Hopper and later the launch allows programmatic dependent launch (`pdl.py`): every ninfer
    kernel begins with `pdl_begin()`, so it may be scheduled while its predecessor drains.
    `clustered`: the kernel's blocks form thread-block clusters of more than one block; with
    `NINFER_KERNELS_ON=cluster_balance` (and PDL on) they are placed by the load-balancing
    policy instead of the default spread (the same blocks and results, another placement).
    """
    cupy = _cupy()
    index = device_index(device)
    stream_ptr = torch.cuda.current_stream(device).cuda_stream
    with cupy.cuda.Device(index):
        if pdl.enabled(index):
            balance = clustered and switches.switched_on("cluster_balance")
            pdl.launch(kernel, grid, block, args, stream_ptr, shared_mem, balance_clusters=balance)
            return
        with _external_stream(stream_ptr, index):
            kernel(grid, block, tuple(args), shared_mem=shared_mem)


def ptr(t: torch.Tensor | None) -> np.uint64:
    """A tensor's device address as a kernel pointer argument (NULL for None)."""
    return np.uint64(0 if t is None else t.data_ptr())


def i32(v: int) -> np.int32:
    return np.int32(v)


def i64(v: int) -> np.int64:
    return np.int64(v)


def f32(v: float) -> np.float32:
    return np.float32(v)


CUDA_TYPES = {torch.float32: "float", torch.bfloat16: "bf16"}


def cuda_type(t: torch.Tensor, what: str) -> str:
    """The kernel-side type name of a tensor's dtype, or a typed error naming the argument."""
    try:
        return CUDA_TYPES[t.dtype]
    except KeyError:
        raise KernelInputError(
            f"{what} has dtype {t.dtype}; kernels take float32 or bfloat16"
        ) from None


def check_cuda(*tensors: torch.Tensor | None) -> torch.device:
    """All given tensors on one CUDA device; returns it."""
    devices = {t.device for t in tensors if t is not None}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise KernelInputError(
            f"kernel inputs must share one CUDA device, got {sorted(map(str, devices))}"
        )
    return next(iter(devices))


def block_size(n: int) -> int:
    """Threads per row-block: the row length rounded up to a warp, at most 1024."""
    return min(1024, max(32, -(-n // 32) * 32))
