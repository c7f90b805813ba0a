"""cuDNN attention plans that do not depend on the exact sequence lengths.

Why: torch's cuDNN SDPA builds an execution plan for every exact (queries, keys, strides) it has
not seen, which costs hundreds of milliseconds on the request path (docs/perf.md, run W1), and a
server meets a new prompt length, and with the context cache a new prefix length, on nearly
every request. With `TORCH_CUDNN_SDPA_AVOID_RECOMPILE=1` torch passes the lengths to cuDNN as
ragged offsets and keys its plan cache on power-of-two bounds, but only for operands in
BSHD memory order ([1, H, T, D] views of contiguous [T, H, D] tensors) and with no bias. torch
reads the variable once, at its first cuDNN attention call, so it is set here, at import, unless
the caller has set it (`=0` keeps torch's per-shape plans).

Imports torch only.
"""

from __future__ import annotations

import os
import warnings

import torch

AVOID_RECOMPILE = "TORCH_CUDNN_SDPA_AVOID_RECOMPILE"

os.environ.setdefault(AVOID_RECOMPILE, "1")
# torch warns once that the variable is experimental; ninfer sets it on purpose
warnings.filterwarnings("ignore", message=f"{AVOID_RECOMPILE}=1 is currently experimental")


def bshd_heads(x: torch.Tensor) -> torch.Tensor:
    """[T, H, D] -> the [1, H, T, D] view SDPA takes, over T-major (BSHD) memory, copying only
    a strided input (e.g. v sliced out of a fused projection), so the length-free plans apply."""
    return x.contiguous().transpose(0, 1)[None]
