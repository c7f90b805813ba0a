"""CUDA launcher of the L2 prefetch of a weight's bytes (kernels/l2_prefetch/l2_prefetch.cu).

Imports torch and kernels.runtime. The launch shape is a pure function of the byte count and
the device's SM count (`plan_launch`), tested on the CPU.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt

OP = "l2_prefetch"
THREADS = 32
PIECE = 4096  # bytes per bulk prefetch instruction
ALIGN = 16  # cp.async.bulk: address and size multiples of 16 bytes


def plan_launch(nbytes: int, num_sms: int) -> tuple[int, ...]:
    """Blocks of THREADS lanes, one PIECE per lane per pass, at most one block an SM: the
    instructions only queue copies, so a few lanes an SM issue them at DRAM speed."""
    pieces = -(-nbytes // PIECE)
    return (max(1, min(num_sms, -(-pieces // THREADS))),)


def supports(t: torch.Tensor) -> bool:
    """A contiguous CUDA tensor on sm_90+, its address and byte size multiples of 16."""
    return (
        t.is_cuda
        and t.is_contiguous()
        and t.data_ptr() % ALIGN == 0
        and (t.numel() * t.element_size()) % ALIGN == 0
        and torch.cuda.get_device_capability(t.device)[0] >= 9
    )


def prefetch(t: torch.Tensor) -> None:
    """Queue `t`'s bytes for L2 on the current stream (see the kernel's note)."""
    device = rt.check_cuda(t)
    if not supports(t):
        raise rt.KernelInputError(
            f"l2_prefetch needs a contiguous sm_90+ tensor of 16-byte multiples, got "
            f"{tuple(t.shape)} {t.dtype} at {t.data_ptr() % ALIGN} past 16 bytes"
        )
    nbytes = t.numel() * t.element_size()
    grid = plan_launch(nbytes, rt.num_sms(device))
    args = (rt.ptr(t), rt.i64(nbytes), rt.i32(PIECE))
    rt.launch(rt.get_kernel(OP, "l2_prefetch", device), grid, (THREADS,), args, device)
