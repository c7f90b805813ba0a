"""Torch twin of the sampling kernel: one token per logits row, exactly as sampling.cu draws it.

Imports torch and kernels.sampling.rng only (engine/sampling.py owns the request-level API and the
semantics' prose). Every rounding step is pinned so the kernel can repeat it: penalties and
temperature in float32, probabilities and the exponential race in float64 (top-p and min-p then
disagree with the kernel only where a float64 library ulp decides, see engine/sampling.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from ninfer.kernels.sampling.rng import RngPurpose, counter_uniforms

TOP_K_CAP = 20  # the spec's top-k ceiling: never more than 20 candidates per row

# columns of RowParams.reals / RowParams.ints
TEMPERATURE, TOP_P, MIN_P, PRESENCE, FREQUENCY = range(5)
TOP_K, GREEDY, SEED, STEP = range(4)


class RowParams(NamedTuple):
    """Per-row sampling fields on the logits' device, packed in two tensors (two small uploads).

    temperature, presence and frequency are used after rounding to float32; top_p and min_p in
    float64. top_k is 1..20 (0 already read as the cap), greedy 0/1, seed a signed int64, step
    the output index of the token being drawn.
    """

    reals: torch.Tensor  # [B, 5] float64: temperature, top_p, min_p, presence, frequency
    ints: torch.Tensor  # [B, 4] int64: top_k, greedy, seed, step

    @classmethod
    def pack(
        cls,
        reals: Sequence[tuple[float, float, float, float, float]],
        ints: Sequence[tuple[int, int, int, int]],
        device: torch.device | str,
    ) -> RowParams:
        """Build on the host, then copy: one transfer per tensor, whatever the batch size."""
        real_t = torch.tensor(reals, dtype=torch.float64).reshape(-1, 5)
        int_t = torch.tensor(ints, dtype=torch.int64).reshape(-1, 4)
        return cls(real_t.to(device, non_blocking=True), int_t.to(device, non_blocking=True))


def sample_tokens(
    logits: torch.Tensor,
    rows: RowParams,
    *,
    num_sampleable: int,
    counts: torch.Tensor | None = None,
    count_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw one token per row (the pipeline is documented on engine.sampling.Sampler).

    Args:
        logits: [B, V] float32 or bfloat16, no NaN; V >= num_sampleable.
        rows: the per-row parameters (B rows).
        num_sampleable: ids at or above it are never drawn.
        counts: [N, >= num_sampleable] int32 occurrence counts of generated ids; None applies no
            penalties (callers pass it whenever a row has one).
        count_rows: [B] int64, the counts row of each logits row; None means row i uses row i.
    Returns:
        [B] int64 token ids.
    """
    cand_ids, log_ratio, keep = survivors(
        logits, rows, num_sampleable=num_sampleable, counts=counts, count_rows=count_rows
    )
    ints = rows.ints
    greedy = ints[:, GREEDY] != 0
    uniforms = counter_uniforms(ints[:, SEED], ints[:, STEP], cand_ids, RngPurpose.SAMPLE)
    race = log_ratio - torch.log(-torch.log(uniforms))  # log(p_i / E_i) + const
    choice = race.masked_fill(~keep, -math.inf).argmax(dim=-1)
    drawn = cand_ids.gather(1, choice[:, None]).squeeze(1)
    return torch.where(greedy, cand_ids[:, 0], drawn)


class Survivors(NamedTuple):
    """A row's candidates after penalties, top-k, temperature, top-p and min-p."""

    cand_ids: torch.Tensor  # [B, K] int64, (logit desc, id asc); column 0 is the greedy choice
    log_ratio: torch.Tensor  # [B, K] float64 log(p_i / p_max), -inf outside the top k
    keep: torch.Tensor  # [B, K] bool, the survivors the draw chooses among


def survivors(
    logits: torch.Tensor,
    rows: RowParams,
    *,
    num_sampleable: int,
    counts: torch.Tensor | None = None,
    count_rows: torch.Tensor | None = None,
    top: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> Survivors:
    """Steps 1-7 of the pipeline (everything before the draw), shared by `sample_tokens` and
    speculative acceptance, which needs the same distribution p the sampler draws from.
    `top`: what picks the candidates (None: `top_candidates`; the acceptance passes the
    kernel's, `dispatch.top_candidates`, which returns the same tensors and takes bf16 or
    float32 logits)."""
    reals, ints = rows
    z = logits[:, :num_sampleable]
    if counts is not None:
        own = counts if count_rows is None else counts.index_select(0, count_rows)
        z = penalized(z, own[:, :num_sampleable], reals[:, PRESENCE], reals[:, FREQUENCY])
    elif top is None:
        z = z.float()
    # (a given `top` takes the logits as they are: the kernel reads bf16 rows in place rather
    # than a float32 copy of B x W vocabulary rows, and returns float32 logits either way)

    num_candidates = min(TOP_K_CAP, num_sampleable)
    cand_ids, cand_z = (top or top_candidates)(z, num_candidates)
    greedy = ints[:, GREEDY] != 0
    temperature = reals[:, TEMPERATURE].float()
    temperature = torch.where(greedy, torch.ones_like(temperature), temperature)
    rank = torch.arange(num_candidates, device=z.device)
    in_top_k = rank[None, :] < ints[:, TOP_K, None]
    scaled = (cand_z / temperature[:, None]).masked_fill(~in_top_k, -math.inf)  # float32

    log_ratio = scaled.double() - scaled[:, :1].double()  # log(p_i / p_max), exact in float64
    weights = torch.exp(log_ratio)  # unnormalised probabilities, 0 outside the top k
    cumulative = torch.cumsum(weights, dim=-1)
    mass_before = cumulative - weights
    top_p = reals[:, TOP_P, None]
    keep = in_top_k & ((mass_before < top_p * cumulative[:, -1:]) | (top_p >= 1.0))
    keep &= log_ratio >= torch.log(reals[:, MIN_P, None])
    keep[:, 0] = True

    return Survivors(cand_ids, log_ratio, keep)


def penalized(
    z: torch.Tensor, counts: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor
) -> torch.Tensor:
    """z - presence * [count > 0] - frequency * count in float32, op by op as the kernel
    rounds it; `presence` and `frequency` ([B] per row) broadcast over z's trailing dims, and
    `counts` broadcasts against z (the speculative acceptance penalizes every verify column
    with this same arithmetic, `acceptance.penalized_columns`)."""
    shape = (-1,) + (1,) * (z.dim() - 1)
    c = counts.float()
    p, f = presence.float().reshape(shape), frequency.float().reshape(shape)
    return z.float() - p * (c > 0) - f * c


def top_candidates(z: torch.Tensor, num_candidates: int) -> tuple[torch.Tensor, torch.Tensor]:
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
