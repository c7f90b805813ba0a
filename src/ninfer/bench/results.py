"""Result records of `ninfer bench` and their JSON form.

Imports only the standard library. Frozen dataclasses so a report is plain data: the CLI renders
it as a table or JSON, and docs/perf.md quotes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class PrefillResult:
    num_tokens: int
    chunk: int  # tokens per forward (the engine's prefill chunk)
    seconds: float  # best of the timed runs, prompt in to first token sampled on the host
    tok_per_s: float
    ttft_ms: float


@dataclass(frozen=True)
class DecodeResult:
    batch: int
    context: int  # tokens already in KV / state when the timed steps start
    graphs: bool
    step_ms: float  # median wall time of one step: replay, argmax, token ids back on the host
    tok_per_s: float  # batch / step time (all rows together)


@dataclass(frozen=True)
class KernelTiming:
    op: str
    shape: str
    torch_us: float  # the torch twin, per call, replayed inside a CUDA graph
    cuda_us: float  # the CuPy kernel, same way
    max_rel_err: float  # kernel vs twin on the timed inputs


@dataclass(frozen=True)
class KernelShare:
    name: str
    calls_per_step: float
    us_per_step: float  # device time of this kernel per decode step
    share: float  # of all kernel time in the step


@dataclass(frozen=True)
class StepProfile:
    """Device time of one eager decode step, by kernel (what a graph replay at best shrinks to)."""

    batch: int
    context: int
    kernel_us: float  # sum of all kernel time per step
    matmul_us: float  # of which cuBLAS / CUTLASS matmuls
    num_kernels: float  # launches per step
    top: list[KernelShare] = field(default_factory=list)
    kind: str = "decode"  # or "prefill": one eager forward of `context` tokens


@dataclass(frozen=True)
class Ceilings:
    copy_tb_s: float  # device-to-device copy, bytes read + written per second
    gemm_tflops: float  # bf16 8192^3 torch.matmul on random data


@dataclass
class BenchReport:
    model: str
    num_params: int
    device: str
    date: str
    torch_version: str
    command: str
    weights: str = "bf16"  # or "fp8": linear weights e4m3 with 128x128 block scales
    load_s: float = 0.0
    prefill: list[PrefillResult] = field(default_factory=list)
    decode: list[DecodeResult] = field(default_factory=list)
    kernels: list[KernelTiming] = field(default_factory=list)
    ceilings: Ceilings | None = None
    profile: StepProfile | None = None
    prefill_profile: StepProfile | None = None
    peak_memory_gib: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
