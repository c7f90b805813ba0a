"""Token sampling on the torch reference path, and the spec's per-architecture sampling presets.

Owns SamplingParams and its validation, the preset table and its precedence rules, a counter-based
RNG and the batched Sampler. Imports only torch and the standard library (no other ninfer module).
Randomness is Philox4x32-10 keyed by the request's seed and counted by (token id, output step,
purpose), so a row's draws never depend on its batch neighbours and a CUDA kernel can mirror them.
"""

from __future__ import annotations

import enum
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

import torch

TOP_K_CAP = 20  # the spec's top-k ceiling; top_k=0 selects it, so at most 20 candidates per row
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


def _fresh_seed() -> int:
    return secrets.randbits(64) + SEED_MIN


# ---------------------------------------------------------------------------------------------
# Counter-based RNG
# ---------------------------------------------------------------------------------------------

_MASK32 = 0xFFFFFFFF
_PHILOX_M0, _PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
_PHILOX_W0, _PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
_PHILOX_ROUNDS = 10


class RngPurpose(enum.IntEnum):
    """Counter word 3: separates draw streams that share (seed, step, lane).

    Speculative decoding's acceptance test and residual draw need their own streams; they are
    registered here so no two users of the RNG collide.
    """

    SAMPLE = 0
    SPEC_ACCEPT = 1
    SPEC_RESIDUAL = 2


def _mulhilo32(a: torch.Tensor, multiplier: int) -> tuple[torch.Tensor, torch.Tensor]:
    # a holds uint32 values in int64 lanes. Splitting the multiplier in 16-bit halves keeps every
    # partial product below 2**49, so nothing relies on signed overflow wrapping.
    m_hi, m_lo = multiplier >> 16, multiplier & 0xFFFF
    low_part = a * m_lo
    mid = a * m_hi + (low_part >> 16)
    return mid >> 16, ((mid & 0xFFFF) << 16) | (low_part & 0xFFFF)


def philox4x32_10(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Philox4x32-10 (Salmon et al. 2011; Random123's constants and known answers).

    Args:
        counter: [..., 4] int64 holding uint32 words.
        key: [..., 2] int64 holding uint32 words, broadcastable against counter[..., 0].
    Returns:
        [..., 4] int64 holding the uint32 output words.
    """
    c0, c1, c2, c3 = counter.unbind(-1)
    k0, k1 = key.unbind(-1)
    for round_idx in range(_PHILOX_ROUNDS):
        if round_idx:
            k0 = (k0 + _PHILOX_W0) & _MASK32
            k1 = (k1 + _PHILOX_W1) & _MASK32
        hi0, lo0 = _mulhilo32(c0, _PHILOX_M0)
        hi1, lo1 = _mulhilo32(c2, _PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack((c0, c1, c2, c3), dim=-1)


def counter_uniforms(
    seeds: torch.Tensor, steps: torch.Tensor, lanes: torch.Tensor, purpose: RngPurpose
) -> torch.Tensor:
    """Uniforms in the open interval (0, 1), one per (row, lane), from word 0 of Philox.

    Key = the seed's two's-complement words (low, high); counter = (lane, step low, step high,
    purpose). The value is (x + 0.5) / 2**32 in float64, exact and never 0 or 1.

    Args:
        seeds: [B] int64 signed seeds.
        steps: [B] int64 non-negative step indices.
        lanes: [B, N] int64 lane ids below 2**32 (the sampler uses token ids).
    Returns:
        [B, N] float64.
    """
    key = torch.stack((seeds & _MASK32, (seeds >> 32) & _MASK32), dim=-1)[:, None, :]  # [B, 1, 2]
    step_lo = (steps & _MASK32)[:, None].expand_as(lanes)
    step_hi = ((steps >> 32) & _MASK32)[:, None].expand_as(lanes)
    counter = torch.stack(
        (lanes, step_lo, step_hi, torch.full_like(lanes, int(purpose))), dim=-1
    )  # [B, N, 4]
    words = philox4x32_10(counter, key)
    return (words[..., 0].to(torch.float64) + 0.5) * 2.0**-32


# ---------------------------------------------------------------------------------------------
# Sampler
# ---------------------------------------------------------------------------------------------


class _RowParams(NamedTuple):
    """Per-row sampling fields as [B] tensors on the logits' device."""

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor
    presence: torch.Tensor
    frequency: torch.Tensor
    greedy: torch.Tensor
    seeds: torch.Tensor
    steps: torch.Tensor


def count_output_ids(
    output_ids: Sequence[Sequence[int]], num_columns: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Per-row occurrence counts of generated ids, the `output_counts` Sampler.sample takes.

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
    """Batched sampler: one token per row of fp32 logits.

    Per row, in this order:
      1. keep columns below `num_sampleable` (lm_head padding rows are never sampled);
      2. penalties on generated tokens only (OpenAI semantics):
         z -= presence * [count > 0] + frequency * count;
      3. greedy rows (greedy flag or temperature 0) take the argmax of z, lowest id on ties;
      4. temperature: z / T;
      5. top-k: the k largest (k = top_k, 0 meaning the cap 20), ties broken toward lower ids;
      6. top-p: softmax over those k, keep the shortest prefix (probability-descending, then id)
         whose mass reaches top_p; the first token always stays;
      7. min-p: keep tokens whose probability is at least min_p times the largest one's (a ratio,
         so the same before or after renormalising, and relative to the temperature-scaled
         distribution);
      8. draw from the survivors' renormalised probabilities by an exponential race: the token
         maximising p_i / E_i, E_i = -log(u_i), u_i = counter_uniforms(seed, step, token id).
    Keying noise by token id makes the draw independent of candidate order and batch layout.
    """

    def __init__(self, num_sampleable: int | None = None) -> None:
        """num_sampleable: ids at or above it are never drawn (tokenizer's last real id + 1)."""
        if num_sampleable is not None and num_sampleable < 1:
            raise ValueError(f"num_sampleable must be positive, got {num_sampleable}")
        self.num_sampleable = num_sampleable

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        steps: Sequence[int],
        output_counts: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Draw one token per row.

        Args:
            logits: [B, V] float logits without NaN; each row needs one finite sampleable value.
            params: B validated-on-entry samplers.
            steps: B output indices of the tokens being drawn (0 for a request's first output
                token); with the seed they fully determine the row's randomness.
            output_counts: [B, >= num_sampleable] counts of each id among the row's generated
                tokens (see count_output_ids); required when any row has a nonzero penalty.
        Returns:
            [B] int64 token ids.
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
        rows = _row_tensors(params, steps, logits.device)
        z = logits[:, :num_sampleable].float()
        if any(p.presence_penalty or p.frequency_penalty for p in params):
            z = _apply_penalties(z, rows, output_counts, num_sampleable)

        num_candidates = min(TOP_K_CAP, num_sampleable)
        cand_ids, cand_z = _top_candidates(z, num_candidates)
        temperature = torch.where(rows.greedy, torch.ones_like(rows.temperature), rows.temperature)
        scaled = cand_z / temperature[:, None]
        rank = torch.arange(num_candidates, device=z.device)
        keep = rank[None, :] < rows.top_k[:, None]
        scaled = scaled.masked_fill(~keep, -math.inf)

        probs = torch.softmax(scaled, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        keep &= (mass_before < rows.top_p[:, None]) | (rows.top_p[:, None] >= 1.0)
        log_ratio = scaled - scaled[:, :1]  # log(p_i / p_max)
        keep &= log_ratio >= torch.log(rows.min_p)[:, None]
        keep[:, 0] = True

        uniforms = counter_uniforms(rows.seeds, rows.steps, cand_ids, RngPurpose.SAMPLE)
        race = log_ratio.double() - torch.log(-torch.log(uniforms))  # log(p_i / E_i) + const
        choice = race.masked_fill(~keep, -math.inf).argmax(dim=-1)
        drawn = cand_ids.gather(1, choice[:, None]).squeeze(1)
        return torch.where(rows.greedy, cand_ids[:, 0], drawn)


def _row_tensors(
    params: Sequence[SamplingParams], steps: Sequence[int], device: torch.device
) -> _RowParams:
    for step in steps:
        if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= SEED_MAX:
            raise ValueError(f"steps must be non-negative 64-bit integers, got {step!r}")
    seeds = [_fresh_seed() if p.seed is None else p.seed for p in params]

    def column(values: list[Any], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)

    return _RowParams(
        temperature=column([p.temperature for p in params], torch.float32),
        top_p=column([p.top_p for p in params], torch.float32),
        top_k=column([p.effective_top_k for p in params], torch.int64),
        min_p=column([p.min_p for p in params], torch.float32),
        presence=column([p.presence_penalty for p in params], torch.float32),
        frequency=column([p.frequency_penalty for p in params], torch.float32),
        greedy=column([p.is_greedy for p in params], torch.bool),
        seeds=column(seeds, torch.int64),
        steps=column(list(steps), torch.int64),
    )


def _apply_penalties(
    z: torch.Tensor, rows: _RowParams, output_counts: torch.Tensor | None, num_sampleable: int
) -> torch.Tensor:
    if output_counts is None:
        raise ValueError("output_counts is required when a row has a presence/frequency penalty")
    if output_counts.shape[0] != z.shape[0] or output_counts.shape[1] < num_sampleable:
        raise ValueError(
            f"output_counts shape {tuple(output_counts.shape)} does not cover "
            f"[{z.shape[0]}, {num_sampleable}]"
        )
    counts = output_counts[:, :num_sampleable].to(device=z.device, dtype=torch.float32)
    return z - rows.presence[:, None] * (counts > 0) - rows.frequency[:, None] * counts


def _top_candidates(z: torch.Tensor, num_candidates: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The num_candidates largest logits per row, ordered by (logit desc, id asc).

    torch.topk does not promise which of several equal values it returns, and bf16-derived logits
    tie often; the choice must not depend on the batch, so ties resolve to the lowest ids through
    a second topk over distinct integer keys.

    Returns:
        ids [B, K] int64 and their logits [B, K] float32.
    """
    num_columns = z.shape[1]
    threshold = torch.topk(z, num_candidates, dim=-1).values[:, -1:]  # [B, 1] K-th largest value
    lower_id_first = num_columns - torch.arange(num_columns, device=z.device, dtype=torch.int32)
    # keys: above threshold > at threshold > below (0); within a class, lower ids rank higher
    key = torch.where(
        z > threshold,
        lower_id_first + num_columns,
        torch.where(z == threshold, lower_id_first, torch.zeros_like(lower_id_first)),
    )  # [B, V] int32
    cand_ids = torch.topk(key, num_candidates, dim=-1).indices
    cand_z, order = torch.sort(z.gather(1, cand_ids), dim=-1, descending=True, stable=True)
    return cand_ids.gather(1, order), cand_z
