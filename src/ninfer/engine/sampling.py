"""Token sampling for requests, and the spec's per-architecture sampling presets.

Owns SamplingParams and its validation, the preset table and its precedence rules, and the batched
Sampler. Imports torch and ninfer.kernels only: the math runs in kernels/sampling (a CUDA kernel on
GPUs, its torch twin elsewhere, chosen by kernels.dispatch). Randomness is Philox4x32-10 keyed by
the request's seed and counted by (token id, output step, purpose), so a row's draws never depend
on its batch neighbours, and kernel and twin draw the same tokens.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from ninfer.kernels import dispatch
from ninfer.kernels.sampling.reference import TOP_K_CAP, RowParams
from ninfer.kernels.sampling.rng import RngPurpose, counter_uniforms, philox4x32_10

__all__ = [  # RngPurpose, counter_uniforms and philox4x32_10 are re-exported from kernels/
    "KNOWN_ARCHITECTURES",
    "MAX_PENALTY",
    "MAX_SAMPLEABLE",
    "MAX_TEMPERATURE",
    "NON_THINKING",
    "SEED_MAX",
    "SEED_MIN",
    "THINKING",
    "TOP_K_CAP",
    "RngPurpose",
    "Sampler",
    "SamplingParamError",
    "SamplingParams",
    "SamplingPreset",
    "SamplingResolver",
    "UnknownArchitectureError",
    "count_output_ids",
    "counter_uniforms",
    "philox4x32_10",
    "presets_for",
    "resolve_sampling",
    "row_fields",
]

MAX_PENALTY = 2.0  # OpenAI's range for presence / frequency penalties is [-2, 2]
MAX_TEMPERATURE = 2.0
SEED_MIN = -(1 << 63)
SEED_MAX = (1 << 63) - 1

THINKING = "thinking"
NON_THINKING = "non_thinking"


class SamplingParamError(ValueError):
    """A sampling field is out of range or of the wrong type; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field} {message}")
        self.field = field


class UnknownArchitectureError(ValueError):
    """No sampling preset is registered for the architecture."""


@dataclass(frozen=True)
class SamplingParams:
    """One request's resolved sampler. `greedy` or `temperature == 0` selects exact argmax.

    `seed` is a signed 64-bit integer; None draws fresh entropy at every step (resolve_sampling
    always fills one in, so a logged request can be replayed).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    greedy: bool = False

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0.0

    @property
    def effective_top_k(self) -> int:
        """top_k with 0 read as the cap: the spec never samples beyond the top 20."""
        return self.top_k or TOP_K_CAP

    def validate(self) -> None:
        """Raise SamplingParamError for the first field outside the spec's range."""
        _check_real("temperature", self.temperature, 0.0, MAX_TEMPERATURE)
        _check_real("top_p", self.top_p, 0.0, 1.0)
        _check_int("top_k", self.top_k, 0, TOP_K_CAP)
        _check_real("min_p", self.min_p, 0.0, 1.0)
        _check_real("presence_penalty", self.presence_penalty, -MAX_PENALTY, MAX_PENALTY)
        _check_real("frequency_penalty", self.frequency_penalty, -MAX_PENALTY, MAX_PENALTY)
        if self.seed is not None:
            _check_int("seed", self.seed, SEED_MIN, SEED_MAX)
        if not isinstance(self.greedy, bool):
            raise SamplingParamError("greedy", f"must be a boolean, got {self.greedy!r}")


def _check_real(field: str, value: object, low: float, high: float) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not low <= value <= high:  # type: ignore[arg-type]
        raise SamplingParamError(
            field, f"must be a finite number in [{low:g}, {high:g}], got {value!r}"
        )


def _check_int(field: str, value: object, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise SamplingParamError(field, f"must be an integer in {low}..{high}, got {value!r}")


# ---------------------------------------------------------------------------------------------
# Presets and precedence
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingPreset:
    """A registered default sampler for one architecture and thinking mode."""

    temperature: float
    top_p: float
    top_k: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float = 0.0


# spec "Engine selects sampling defaults": temp / top-p / top-k / min-p / presence; frequency 0.
_DENSE_PRESETS = {
    THINKING: SamplingPreset(1.0, 0.95, 20, 0.0, 0.0),
    NON_THINKING: SamplingPreset(0.7, 0.80, 20, 0.0, 1.5),
}
_MOE_PRESETS = {
    THINKING: SamplingPreset(1.0, 0.95, 20, 0.0, 1.5),
    NON_THINKING: SamplingPreset(0.7, 0.80, 20, 0.0, 1.5),
}

# Explicit names rather than fuzzy matching: HF model types, HF architecture classes and the
# public checkpoint names. Qwen3.5/3.6/3.8 share model types, so one dense and one MoE table.
_DENSE_NAMES = (
    "qwen3_5",
    "qwen3_5_text",
    "qwen3_5forconditionalgeneration",
    "qwen3_5forcausallm",
    "qwen3.5-27b",
    "qwen3.6-27b",
    "qwen3.8-27b",
)
_MOE_NAMES = (
    "qwen3_5_moe",
    "qwen3_5_moe_text",
    "qwen3_5moeforconditionalgeneration",
    "qwen3_5moeforcausallm",
    "qwen3.5-35b-a3b",
    "qwen3.6-35b-a3b",
)
_PRESETS_BY_NAME = dict.fromkeys(_DENSE_NAMES, _DENSE_PRESETS) | dict.fromkeys(
    _MOE_NAMES, _MOE_PRESETS
)
KNOWN_ARCHITECTURES = tuple(_PRESETS_BY_NAME)


def presets_for(architecture: str) -> dict[str, SamplingPreset]:
    """The "thinking" and "non_thinking" presets of an architecture (case-insensitive name)."""
    table = _PRESETS_BY_NAME.get(architecture.strip().lower())
    if table is None:
        raise UnknownArchitectureError(
            f"no sampling preset for architecture {architecture!r}; "
            f"known: {', '.join(KNOWN_ARCHITECTURES)}"
        )
    return dict(table)


_PARAM_FIELDS = frozenset(f.name for f in fields(SamplingParams))
_FLOAT_FIELDS = frozenset(
    ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty")
)


def resolve_sampling(
    preset: SamplingPreset,
    process_overrides: Mapping[str, Any],
    request_overrides: Mapping[str, Any],
    *,
    greedy: bool,
) -> SamplingParams:
    """Apply the spec's precedence: preset < process flag < request field, then --greedy.

    Overrides are keyed by SamplingParams field names; a None value means "not given", so CLI
    options and omitted JSON fields can be passed through unfiltered. A seed still missing after
    both layers becomes a fresh random signed 64-bit seed, so the resolved sampler is replayable.
    Greedy forces temperature 0 after everything else.
    """
    values: dict[str, Any] = {f.name: getattr(preset, f.name) for f in fields(SamplingPreset)}
    for overrides in (process_overrides, request_overrides):
        for name, value in overrides.items():
            if name not in _PARAM_FIELDS:
                raise SamplingParamError(name, "is not a sampling field")
            if value is None:
                continue
            is_number = isinstance(value, int) and not isinstance(value, bool)
            values[name] = float(value) if name in _FLOAT_FIELDS and is_number else value
    if values.get("seed") is None:
        values["seed"] = _fresh_seed()
    params = SamplingParams(**values)
    if greedy:
        params = replace(params, temperature=0.0, greedy=True)
    params.validate()
    return params


class SamplingResolver:
    """The one place a request's sampler is resolved and validated: the artifact's preset for
    the request's thinking mode < the process flags < the request's fields; greedy (process or
    request) last."""

    def __init__(
        self,
        presets: Mapping[str, SamplingPreset],
        process_overrides: Mapping[str, Any],
        *,
        greedy: bool = False,
    ) -> None:
        self.presets = dict(presets)
        self.process_overrides = dict(process_overrides)
        self.greedy = greedy

    def resolve(self, request: Any) -> SamplingParams:
        """`request` is an engine GenerationRequest (its `thinking` and `sampling` fields)."""
        preset = self.presets[THINKING if request.thinking else NON_THINKING]
        overrides = dict(request.sampling)
        greedy = bool(overrides.pop("greedy", False)) or self.greedy
        return resolve_sampling(preset, self.process_overrides, overrides, greedy=greedy)


def _fresh_seed() -> int:
    return secrets.randbits(64) + SEED_MIN


# ---------------------------------------------------------------------------------------------
# Sampler
# ---------------------------------------------------------------------------------------------

MAX_SAMPLEABLE = (1 << 31) - 2  # token ids are int32 inside the kernel


def count_output_ids(
    output_ids: Sequence[Sequence[int]], num_columns: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Per-row occurrence counts of generated ids, from scratch (the decode step's per-slot
    `counts` keep the same numbers incrementally; this is their definition and their tests'
    reference).

    Returns:
        [B, num_columns] int32.
    """
    counts = torch.zeros((len(output_ids), num_columns), dtype=torch.int32, device=device)
    for row, ids in enumerate(output_ids):
        if ids:
            index = torch.as_tensor(list(ids), dtype=torch.int64, device=device)
            counts[row].index_add_(0, index, torch.ones_like(index, dtype=torch.int32))
    return counts


class Sampler:
    """Batched sampler: one token per row of logits.

    Per row, in this order:
      1. keep columns below `num_sampleable` (lm_head padding rows are never sampled);
      2. penalties on generated tokens only (OpenAI semantics), in float32:
         z -= presence * [count > 0] + frequency * count;
      3. greedy rows (greedy flag or temperature 0) take the argmax of z, lowest id on ties;
      4. top-k: the k largest z (k = top_k, 0 meaning the cap 20), ties broken toward lower ids;
      5. temperature: s = z / T in float32; from here on float64, with r_i = s_i - s_max the
         log-probability ratio log(p_i / p_max) (exact) and w_i = exp(r_i);
      6. top-p: keep the shortest prefix (probability-descending, then id) whose mass reaches
         top_p: token i stays while the mass before it, w_0 + ... + w_{i-1}, is below
         top_p * sum(w); the first token always stays;
      7. min-p: keep tokens with r_i >= log(min_p), i.e. p_i >= min_p * p_max (a ratio, so the
         same before or after renormalising, relative to the temperature-scaled distribution);
      8. draw from the survivors by an exponential race: the token maximising r_i - log(E_i),
         E_i = -log(u_i), u_i = counter_uniforms(seed, step, token id), i.e. p_i / E_i.
    Keying noise by token id makes the draw independent of candidate order and batch layout.

    Kernel and twin (kernels/sampling) round every step alike, so they draw the same token except
    where two float64 values that decide it are within a library ulp of each other: a race
    between two survivors (|r_i - log E_i - (r_j - log E_j)| ~ 1e-16), a prefix mass against
    top_p * sum(w), or r_i against log(min_p). For continuous inputs each has probability of
    order 1e-15 per row; exact coincidences (tied logits) are computed exactly on both sides.
    """

    def __init__(self, num_sampleable: int | None = None) -> None:
        """num_sampleable: ids at or above it are never drawn (tokenizer's last real id + 1)."""
        if num_sampleable is not None and not 1 <= num_sampleable <= MAX_SAMPLEABLE:
            raise ValueError(f"num_sampleable must be in 1..{MAX_SAMPLEABLE}, got {num_sampleable}")
        self.num_sampleable = num_sampleable

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        steps: Sequence[int],
        output_counts: torch.Tensor | None = None,
        count_rows: torch.Tensor | Sequence[int] | None = None,
    ) -> torch.Tensor:
        """Draw one token per row.

        Args:
            logits: [B, V] float32 or bfloat16 logits without NaN; each row needs one finite
                sampleable value.
            params: B validated-on-entry samplers.
            steps: B output indices of the tokens being drawn (0 for a request's first output
                token); with the seed they fully determine the row's randomness.
            output_counts: [N, >= num_sampleable] int32 counts of each id among a sequence's
                generated tokens (see count_output_ids, engine.graphs.DecodeStep); required when
                any row has a nonzero penalty.
            count_rows: B row indices into output_counts (a per-slot buffer is read in place);
                None means logits row i uses counts row i.
        Returns:
            [B] int64 token ids on the logits' device.
        """
        num_rows, num_columns = logits.shape
        if len(params) != num_rows or len(steps) != num_rows:
            raise ValueError(
                f"got {num_rows} logit rows, {len(params)} params and {len(steps)} steps"
            )
        num_sampleable = self.num_sampleable or num_columns
        if num_sampleable > num_columns:
            raise ValueError(f"logits have {num_columns} columns, fewer than {num_sampleable}")
        for row_params in params:
            row_params.validate()
        rows = _row_params(params, steps, logits.device)
        counts = rows_index = None
        if any(p.presence_penalty or p.frequency_penalty for p in params):
            counts, rows_index = _check_counts(
                output_counts, count_rows, num_rows, num_sampleable, logits.device
            )
        if logits.dtype not in (torch.float32, torch.bfloat16):
            logits = logits.float()
        return dispatch.sample_tokens(
            logits, rows, num_sampleable=num_sampleable, counts=counts, count_rows=rows_index
        )


def _row_params(
    params: Sequence[SamplingParams], steps: Sequence[int], device: torch.device
) -> RowParams:
    for step in steps:
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= SEED_MAX:
            raise ValueError(f"steps must be non-negative 64-bit integers, got {step!r}")
    fields_ = [row_fields(p, step) for p, step in zip(params, steps, strict=True)]
    return RowParams.pack([f[0] for f in fields_], [f[1] for f in fields_], device)


def row_fields(
    p: SamplingParams, step: int
) -> tuple[tuple[float, float, float, float, float], tuple[int, int, int, int]]:
    """The kernel's per-row fields: (temperature, top_p, min_p, presence, frequency) and
    (top_k, greedy, seed, step). A missing seed draws fresh entropy for this row."""
    reals = (p.temperature, p.top_p, p.min_p, p.presence_penalty, p.frequency_penalty)
    seed = _fresh_seed() if p.seed is None else p.seed
    return reals, (p.effective_top_k, int(p.is_greedy), seed, step)


def _check_counts(
    output_counts: torch.Tensor | None,
    count_rows: torch.Tensor | Sequence[int] | None,
    num_rows: int,
    num_sampleable: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if output_counts is None:
        raise ValueError("output_counts is required when a row has a presence/frequency penalty")
    if output_counts.dim() != 2 or output_counts.shape[1] < num_sampleable:
        raise ValueError(
            f"output_counts shape {tuple(output_counts.shape)} has fewer than "
            f"{num_sampleable} columns"
        )
    counts = output_counts.to(device=device, dtype=torch.int32)
    if count_rows is None:
        if counts.shape[0] != num_rows:
            raise ValueError(f"output_counts has {counts.shape[0]} rows for {num_rows} logit rows")
        return counts, None
    if not isinstance(count_rows, torch.Tensor):
        bad = [r for r in count_rows if not 0 <= r < counts.shape[0]]
        if bad:
            raise ValueError(f"count_rows {bad} outside 0..{counts.shape[0] - 1}")
        count_rows = torch.tensor(list(count_rows), dtype=torch.int64)
    if count_rows.shape != (num_rows,):
        raise ValueError(f"count_rows must hold {num_rows} row indices")
    return counts, count_rows.to(device=device, dtype=torch.int64, non_blocking=True)
