"""Speculative acceptance: which drafted tokens a verify step keeps, and what it commits after.

Imports torch, the sampling twin and kernels.dispatch (the counter RNG's Philox runs as one
kernel on CUDA). Per verify row, column j holds the target's logits after feeding t0,
d1..dj. Its distribution p_j is exactly the one the sampler would draw the next token from
(kernels/sampling `survivors`: penalties, top-k, temperature, top-p, min-p; the penalty counts
include the drafts d1..dj, as they would after committing them). Walking the columns left to
right, draft d_{j+1} is accepted:

- greedy rows: iff it is the target's argmax (ties to the lowest id), so the committed tokens
  are exactly those plain greedy decoding would commit;
- sampled rows: with probability min(1, p(d) / q(d)) (q is the draft distribution; MTP drafts
  are argmax, so q is one-hot and the test is u < p(d)); on rejection the committed token is
  drawn from norm(max(p - q, 0)). This keeps every committed token distributed by p exactly
  (Leviathan et al. 2023; Chen et al. 2023).

The first rejected column commits its replacement and ends the row; a row whose drafts all pass
commits a bonus token drawn from its last column like a plain decode step. Every uniform comes
from the counter RNG keyed by (seed, output index, token id, purpose) with its own purpose per
use (`RngPurpose.SPEC_ACCEPT`, `SPEC_RESIDUAL`), so a draw never depends on batch neighbours.
"""

from __future__ import annotations

import math

import torch

from ninfer.kernels.dispatch import counter_uniforms, top_candidates
from ninfer.kernels.sampling.reference import (
    FREQUENCY,
    GREEDY,
    PRESENCE,
    SEED,
    STEP,
    RowParams,
    penalized,
    survivors,
)
from ninfer.kernels.sampling.rng import RngPurpose


def accept_draft(
    p: torch.Tensor,
    q: torch.Tensor,
    lane_ids: torch.Tensor,
    draft_lane: torch.Tensor,
    seeds: torch.Tensor,
    steps: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rejection-sampling step over N lanes per row (token ids `lane_ids`).

    Args:
        p, q: [B, N] target and draft probabilities (rows sum to 1; q > 0 at the draft).
        lane_ids: [B, N] int64 token ids of the lanes (distinct within a row).
        draft_lane: [B] int64, the lane of the drafted token.
        seeds, steps: [B] int64 RNG key and output index of the token being decided.
    Returns:
        (accepted [B] bool, replacement [B] int64: the lane drawn from norm(max(p - q, 0)),
        meaningful where not accepted).
    """
    p, q = p.double(), q.double()
    p_d = p.gather(1, draft_lane[:, None]).squeeze(1)
    q_d = q.gather(1, draft_lane[:, None]).squeeze(1)
    draft_ids = lane_ids.gather(1, draft_lane[:, None])
    u = counter_uniforms(seeds, steps, draft_ids, RngPurpose.SPEC_ACCEPT).squeeze(1)
    accepted = u * q_d < p_d  # u < p/q, i.e. probability min(1, p/q)
    residual = (p - q).clamp_min(0.0)
    # an exponential race over the residual's support: lane i wins with probability r_i / sum r
    race_u = counter_uniforms(seeds, steps, lane_ids, RngPurpose.SPEC_RESIDUAL)
    race = torch.log(residual) - torch.log(-torch.log(race_u))
    race = race.masked_fill(residual <= 0, -math.inf)
    return accepted, race.argmax(dim=-1)


def verify(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    rows: RowParams,
    *,
    num_sampleable: int,
    counts: torch.Tensor | None = None,
    count_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Acceptance over verify rows of W = k + 1 columns.

    Args:
        logits: [B, W, V] target logits; column j follows t0, d1..dj.
        drafts: [B, k] int64 drafted ids (argmax proposals: q is one-hot).
        rows: per-row sampling fields; STEP is the output index of column 0's token.
        counts, count_rows: penalty counts (as for `sample_tokens`), without the drafts.
    Returns:
        (committed [B, W] int64: the a + 1 committed tokens first, then padding,
        num_accepted [B] int64: a, the drafts kept).
    """
    logits = _column_logits(logits, drafts, rows, num_sampleable, counts, count_rows)
    return _verify_at_once(logits, drafts, rows, num_sampleable=num_sampleable)


def _column_logits(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    rows: RowParams,
    num_sampleable: int,
    counts: torch.Tensor | None,
    count_rows: torch.Tensor | None,
) -> torch.Tensor:
    """The logits the acceptance reads: as given without counts, else each column's penalized
    ones (`penalized_columns`: the drafts before a column counted)."""
    if counts is None:
        return logits
    return penalized_columns(
        logits, drafts, rows, num_sampleable=num_sampleable, counts=counts, count_rows=count_rows
    )


def penalized_columns(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    rows: RowParams,
    *,
    num_sampleable: int,
    counts: torch.Tensor,
    count_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every verify column's logits after the presence and frequency penalties, all at once:
    column j's counts are the row's counts plus the drafts d1..dj (as after committing them),
    which differ from the row's own counts only at those j ids. So the penalties of the row's
    counts go on every column, and each column's draft ids are then rewritten with their
    counts raised, both through the sampler's own `penalized` (as `survivors` applies it), so
    the result is bitwise what the column walk hands `survivors`; it replaces a walk of W
    steps of full-vocabulary top-k (hundreds of small kernels inside a round's graph) with a
    handful of kernels.

    A column after a draft that fails is never read (`_commit`), so a draft's raised count
    may reach columns the walk would have left it out of; ids at or past `num_sampleable`
    (never accepted) are clamped into range for the same reason.

    Args:
        logits: [B, W, V]; drafts: [B, W - 1]; counts, count_rows: as for `verify`.
    Returns:
        [B, W, num_sampleable] float32.
    """
    num_rows, width, _ = logits.shape
    own = counts if count_rows is None else counts.index_select(0, count_rows)
    presence, frequency = rows.reals[:, PRESENCE], rows.reals[:, FREQUENCY]
    z = penalized(logits[:, :, :num_sampleable], own[:, None, :num_sampleable], presence, frequency)
    if width == 1:
        return z
    ids = drafts.clamp(0, num_sampleable - 1)  # [B, k]
    # extra[b, j, i]: how often d_i occurs among d_1..d_j, the drafts column j counts
    same = (ids[:, :, None] == ids[:, None, :]).to(torch.int64)  # [B, m, i]
    extra = torch.cat((same.new_zeros(num_rows, 1, ids.shape[1]), same.cumsum(dim=1)), dim=1)
    at = ids[:, None, :].expand(num_rows, width, ids.shape[1])  # [B, W, k]
    raised = own.gather(1, ids)[:, None, :] + extra
    value = penalized(logits.gather(2, at), raised, presence, frequency)
    # a column's writes to one id carry one value (its count there), duplicates included
    return z.scatter_(2, at, value)


def _verify_walk(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    rows: RowParams,
    *,
    num_sampleable: int,
    counts: torch.Tensor | None,
    count_rows: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`verify` column by column, as the rule is defined: column j's penalty counts include
    the drafts before it. The reference twin that the tests hold `verify`'s at-once form
    (`penalized_columns`, `_verify_at_once`) to; no round runs it."""
    num_rows, width, _ = logits.shape
    device = logits.device
    reals, ints = rows
    greedy = ints[:, GREEDY] != 0
    own = None
    if counts is not None:
        base = counts if count_rows is None else counts.index_select(0, count_rows)
        own = base[:, :num_sampleable].clone()
    committed = torch.zeros((num_rows, width), dtype=torch.int64, device=device)
    num_accepted = torch.zeros(num_rows, dtype=torch.int64, device=device)
    alive = torch.ones(num_rows, dtype=torch.bool, device=device)
    for j in range(width):
        step_ints = ints.clone()
        step_ints[:, STEP] = ints[:, STEP] + j
        params = RowParams(reals, step_ints)
        cand, log_ratio, keep = survivors(
            logits[:, j], params, num_sampleable=num_sampleable, counts=own
        )
        plain = _race(cand, log_ratio, keep, step_ints)
        token = torch.where(greedy, cand[:, 0], plain)  # the bonus: a plain decode step's draw
        if j < width - 1:
            d = drafts[:, j]
            ok, token = _judge_drafts(cand, log_ratio, keep, d, greedy, step_ints)
            if own is not None:  # the next column sees d counted, as after committing it
                own.scatter_add_(1, d[:, None].clamp_max(num_sampleable - 1), ok[:, None].int())
        else:
            ok = torch.zeros(num_rows, dtype=torch.bool, device=device)
        committed[:, j] = torch.where(alive, token, committed[:, j])
        num_accepted += (alive & ok).to(torch.int64)
        alive &= ok
    return committed, num_accepted


def _verify_at_once(
    logits: torch.Tensor, drafts: torch.Tensor, rows: RowParams, *, num_sampleable: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`verify` without penalty counts, every column at once: the same survivors, draws and
    tests as the walk (each keyed by its row's seed and its column's output index), on B * W
    rows instead of W steps of B, so a round's graph holds a few dozen kernels, not W times
    that. The walk's "alive" bookkeeping becomes a cumulative product over the columns."""
    num_rows, width, vocab = logits.shape
    device = logits.device
    reals, ints = rows
    cols = torch.arange(width, device=device)
    col_ints = ints[:, None, :].repeat(1, width, 1)
    col_ints[:, :, STEP] += cols
    flat = RowParams(reals.repeat_interleave(width, dim=0), col_ints.reshape(-1, ints.shape[1]))
    cand, log_ratio, keep = survivors(
        logits.reshape(-1, vocab), flat, num_sampleable=num_sampleable, top=top_candidates
    )
    greedy = flat.ints[:, GREEDY] != 0
    plain = torch.where(greedy, cand[:, 0], _race(cand, log_ratio, keep, flat.ints))
    tokens = plain.view(num_rows, width).clone()  # a column's own draw (the bonus at the end)
    passed = torch.zeros((num_rows, width - 1), dtype=torch.bool, device=device)
    if width > 1:
        # the drafted columns: rows (b, j) for j < W - 1, drafts[b, j] proposed there
        first = torch.arange(num_rows, device=device)[:, None] * width
        pick = (first + cols[None, :-1]).reshape(-1)
        ok, drawn = _judge_drafts(
            cand[pick],
            log_ratio[pick],
            keep[pick],
            drafts.reshape(-1),
            greedy[pick],
            flat.ints[pick],
        )
        tokens[:, :-1] = drawn.view(num_rows, width - 1)
        passed = ok.view(num_rows, width - 1)
    return _commit(tokens, passed)


def _judge_drafts(
    cand: torch.Tensor,
    log_ratio: torch.Tensor,
    keep: torch.Tensor,
    drafts: torch.Tensor,
    greedy: torch.Tensor,
    ints: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One drafted column per row (its survivors, its draft, its row's sampler ints with the
    column's STEP): (accepted [N] bool, the token it commits: the draft, or the replacement)."""
    weights = torch.exp(log_ratio).masked_fill(~keep, 0.0)
    p = weights / weights.sum(-1, keepdim=True)
    # lanes: the candidates plus the draft itself (it may lie outside them: p = 0 there)
    lanes = torch.cat((cand, drafts[:, None]), dim=1)
    p_ext = torch.cat((p, p.new_zeros(p.shape[0], 1)), dim=1)
    is_d = cand == drafts[:, None]
    d_lane = torch.where(is_d.any(dim=1), is_d.to(torch.int64).argmax(dim=1), cand.shape[1])
    q_ext = torch.zeros_like(p_ext).scatter_(1, d_lane[:, None], 1.0)
    ok, lane = accept_draft(p_ext, q_ext, lanes, d_lane, ints[:, SEED], ints[:, STEP])
    ok = torch.where(greedy, cand[:, 0] == drafts, ok)
    replacement = torch.where(greedy, cand[:, 0], lanes.gather(1, lane[:, None])[:, 0])
    return ok, torch.where(ok, drafts, replacement)


def _commit(tokens: torch.Tensor, passed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(committed, num_accepted) from each column's token [B, W] and whether drafts 1..W-1
    passed [B, W - 1]: the drafts kept up to the first failure, then that column's token."""
    num_accepted = passed.to(torch.int64).cumprod(dim=1).sum(dim=1)
    cols = torch.arange(tokens.shape[1], device=tokens.device)
    committed = torch.where(cols[None, :] <= num_accepted[:, None], tokens, 0)
    return committed, num_accepted


def verify_greedy(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    *,
    num_sampleable: int,
    rows: RowParams | None = None,
    counts: torch.Tensor | None = None,
    count_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`verify` for rows that are all greedy: the target's argmax per column (ties to the
    lowest id, as the sampler's greedy pick), drafts kept while they equal it. The same
    results as `verify` on such rows, in a handful of kernels where the general walk runs the
    sampler's filters and the counter RNG per column (thousands of small kernels inside a
    round's graph). With `counts` (and `rows`, for the penalties), the argmax is over each
    column's penalized logits (`penalized_columns`), as greedy decoding takes it.

    Args / Returns: as `verify`.
    """
    target = greedy_targets(
        logits,
        drafts,
        num_sampleable=num_sampleable,
        rows=rows,
        counts=counts,
        count_rows=count_rows,
    )
    return _commit(target, target[:, :-1] == drafts)


def greedy_targets(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    *,
    num_sampleable: int,
    rows: RowParams | None = None,
    counts: torch.Tensor | None = None,
    count_rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """The target's greedy token per column [B, W] (`verify_greedy` before it compares them with
    the drafts: a round's graph hands them to `dispatch.round_commit`, which does both)."""
    if counts is not None:
        if rows is None:
            raise ValueError("penalty counts need the rows' penalties")
        logits = _column_logits(logits, drafts, rows, num_sampleable, counts, count_rows)
    return logits[:, :, :num_sampleable].argmax(dim=-1)  # first maximum, lowest id


def _race(
    cand: torch.Tensor, log_ratio: torch.Tensor, keep: torch.Tensor, ints: torch.Tensor
) -> torch.Tensor:
    """The sampler's own draw among the survivors (purpose SAMPLE: a plain decode step's)."""
    uniforms = counter_uniforms(ints[:, SEED], ints[:, STEP], cand, RngPurpose.SAMPLE)
    race = log_ratio - torch.log(-torch.log(uniforms))
    choice = race.masked_fill(~keep, -math.inf).argmax(dim=-1)
    return cand.gather(1, choice[:, None]).squeeze(1)
