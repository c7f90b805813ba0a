"""Result records of `ninfer bench` and their JSON form.

Imports only the standard library. Frozen dataclasses so a report is plain data: the CLI renders
it as a table or JSON, and docs/perf.md quotes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ninfer.bench.gpu_state import GpuState


@dataclass(frozen=True)
class PrefillResult:
    num_tokens: int
    chunk: int  # tokens per forward (the engine's prefill chunk)
    seconds: float  # best of the timed runs, prompt in to first token sampled on the host
    tok_per_s: float
    ttft_ms: float
    # the first run of this length: it also pays one-time costs (cuDNN attention plans for a new
    # length bucket, allocator growth) that the first request of that size meets in a server
    first_ttft_ms: float | None = None


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
class MatmulShape:
    """One matmul shape's device time in a profiled step (the op's kernels, whatever cuBLAS
    named them), so a slow GEMM can be told from a slow layer."""

    op: str  # aten::mm, aten::addmm, ...
    shape: str  # "M x K @ K x N"
    calls_per_step: float
    us_per_step: float
    tflops: float  # 2 M N K per call over its time


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
    matmuls: list[MatmulShape] = field(default_factory=list)  # torch matmul ops by input shape


@dataclass(frozen=True)
class Ceilings:
    copy_tb_s: float  # device-to-device copy, bytes read + written per second
    gemm_tflops: float  # bf16 8192^3 torch.matmul on random data


@dataclass(frozen=True)
class LogitCheck:
    """ninfer's and HF's logits on the same prefill: a check that both run the same weights
    (bf16 kernels differ, so small differences are expected), not a benchmark."""

    num_tokens: int  # prompt length of the checked prefill
    num_positions: int  # last positions compared
    max_abs_diff: float  # max |ninfer - HF| over those logits
    max_abs_logit: float  # max |HF logit| there: the scale the difference reads against
    rel_l2: float  # ||ninfer - HF|| / ||HF||
    argmax_agree: float  # share of the positions whose greedy token is the same


@dataclass
class HfComparison:
    """The `--compare hf` run: HF transformers over the ninfer model's own weight tensors."""

    transformers_version: str
    attn_implementation: str
    decode_steps: int  # timed steps per decode cell (after 2 warm-up steps)
    build_s: float = 0.0  # building the HF model on the meta device and binding the tensors
    peak_memory_gib: float = 0.0  # during the HF part, the shared weights included
    prefill: list[PrefillResult] = field(default_factory=list)
    decode: list[DecodeResult] = field(default_factory=list)  # eager (graphs False)
    logit_check: LogitCheck | None = None


@dataclass(frozen=True)
class CompareRow:
    """One workload cell both ran: throughput of each and their ratio."""

    workload: str  # "prefill 2048 tokens" or "decode batch 8 at 1024 context"
    ninfer_tok_per_s: float | None  # None: ninfer's matrix did not hold this cell
    hf_tok_per_s: float
    ratio: float | None  # ninfer / HF


@dataclass(frozen=True)
class E2eResult:
    batch: int
    prompt_tokens: int
    output_tokens: int  # per request
    steady_tok_per_s: float  # all rows decoding: committed tokens / window
    wall_tok_per_s: float  # every output token / (submit -> last finish)
    ttft_ms_p50: float
    ttft_ms_max: float
    raw_tok_per_s: float | None = None  # the raw decode step at this batch (same run)

    @property
    def ratio(self) -> float | None:
        return self.steady_tok_per_s / self.raw_tok_per_s if self.raw_tok_per_s else None


@dataclass(frozen=True)
class InterferenceResult:
    batch: int
    long_prompt: int  # tokens of the prompt that arrives while the streams decode
    prefill_chunk: int
    itl_p50_ms_before: float
    itl_p99_ms_before: float
    itl_p50_ms_during: float
    itl_p99_ms_during: float
    itl_max_ms_during: float
    chunk_prefill_ms: float  # one prefill chunk of `prefill_chunk` tokens alone


@dataclass(frozen=True)
class ContextCacheResult:
    """`--context-cache`: a second turn's time to first token cold and with a prefix hit, and
    one sequence's snapshot to pinned host memory and restore, timed on the device."""

    turn_tokens: int  # the first turn's prompt
    second_turn_prompt: int
    cached_tokens: int  # reused by the warm second turn
    cold_ttft_ms: float
    warm_ttft_ms: float
    same_output: bool  # the warm and cold second turns drew the same first tokens
    snapshot_tokens: int
    snapshot_bytes: int  # StateImage + KV pages
    snapshot_ms: float  # device to pinned host, best round
    restore_ms: float  # pinned host to device, best round
    first_snapshot_ms: float  # the first round (pinned blocks allocated on the way)
    first_restore_ms: float

    @property
    def ttft_ratio(self) -> float:
        return self.warm_ttft_ms / self.cold_ttft_ms if self.cold_ttft_ms else 0.0


@dataclass
class AbResult:
    """`--ab`: the decode batches again with one setting (NAME=VALUE; '' = the base re-timed)."""

    setting: str
    decode: list[DecodeResult] = field(default_factory=list)


@dataclass
class BenchReport:
    model: str
    num_params: int
    device: str
    date: str
    torch_version: str
    command: str
    weights: str = "bf16"  # or "fp8": linear weights e4m3 with 128x128 block scales
    kv_dtype: str = "bf16"  # `--kv-dtype` of the prefill/decode matrix's KV cache
    decode_tiles: bool = False  # `--decode-tiles`: tile-major copies of the decode weights bound
    load_s: float = 0.0
    prefill: list[PrefillResult] = field(default_factory=list)
    decode: list[DecodeResult] = field(default_factory=list)
    kernels: list[KernelTiming] = field(default_factory=list)
    ceilings: Ceilings | None = None
    profile: StepProfile | None = None
    prefill_profile: StepProfile | None = None
    batch_profile: StepProfile | None = None  # the largest decode batch, when it is not 1
    peak_memory_gib: float = 0.0
    gpu_start: GpuState | None = None  # clocks, power, temperature before the matrix
    gpu_end: GpuState | None = None  # and after it (bench/gpu_state.py)
    notes: list[str] = field(default_factory=list)
    hf: HfComparison | None = None
    e2e: list[E2eResult] = field(default_factory=list)  # `--e2e`: through the public Engine
    interference: InterferenceResult | None = None
    context_cache: ContextCacheResult | None = None  # `--context-cache`
    ab: list[AbResult] = field(default_factory=list)  # `--ab`: settings, then the base again

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["e2e"] = [asdict(r) | {"ratio": r.ratio} for r in self.e2e]
        if self.context_cache is not None:
            out["context_cache"]["ttft_ratio"] = self.context_cache.ttft_ratio
        if self.hf is not None:
            out["compare_hf"] = [asdict(row) for row in comparison_rows(self)]
        return out


def comparison_rows(report: BenchReport) -> list[CompareRow]:
    """Each HF cell beside ninfer's number for the same cell (its graph row where it has one:
    what the engine runs), in HF's order."""
    if report.hf is None:
        return []
    rows = []
    prefill = {p.num_tokens: p.tok_per_s for p in report.prefill}
    for p in report.hf.prefill:
        rows.append(_row(f"prefill {p.num_tokens} tokens", prefill.get(p.num_tokens), p.tok_per_s))
    for d in report.hf.decode:
        same = [n for n in report.decode if (n.batch, n.context) == (d.batch, d.context)]
        same.sort(key=lambda n: not n.graphs)  # graph rows first
        ninfer = same[0].tok_per_s if same else None
        rows.append(_row(f"decode batch {d.batch} at {d.context} context", ninfer, d.tok_per_s))
    return rows


def _row(workload: str, ninfer: float | None, hf: float) -> CompareRow:
    ratio = ninfer / hf if ninfer is not None and hf > 0 else None
    return CompareRow(workload, ninfer, hf, ratio)
