"""Torch twin of the round-feed kernels: a round's bookkeeping for the round chained after it.

Imports only torch. A speculative round (engine/spec_step.py) leaves per slot the token it
committed last, that token's KV index and output index, the columns it keeps (its fold) and its
committed tokens; a round planned while that one was in flight (chained) takes them. These are
the ops the round body ran for it (about 30 small kernels, each a launch and a dependency inside
the round's CUDA graph); the kernels do the same in two launches. `round_commit` is the round's
own bookkeeping after its verify (what it keeps, the head pass's ids, its result rows): about 16
small kernels, one launch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def take_feed(
    t0: torch.Tensor,
    position: torch.Tensor,
    step: torch.Tensor,
    chain: torch.Tensor,
    slots: torch.Tensor,
    feeds: torch.Tensor,
    feed_committed: torch.Tensor,
    counts: torch.Tensor,
) -> None:
    """For rows with chain != 0: t0, position and step (in place) from the slot's feeds, and the
    slot's committed tokens (-1: none) each counted once more in `counts`.

    Args:
        t0, position, step, chain, slots: [B] int64 (may be strided columns).
        feeds: [4, S] int64 (token, position, step, columns); feed_committed: [S, W] int64;
        counts: [S, V] int32 penalty counts.
    """
    chained = chain != 0
    columns = (t0, position, step)
    fed = feeds[:3].index_select(1, slots)  # [3, B]
    taken = torch.where(chained, fed, torch.stack(columns))
    for column, values in zip(columns, taken, strict=True):
        column.copy_(values)
    tokens = feed_committed.index_select(0, slots)  # [B, W]
    add = (chained[:, None] & (tokens >= 0)).to(counts.dtype)
    flat = torch.add(tokens.clamp(min=0), slots[:, None], alpha=counts.shape[1])
    counts.view(-1).index_add_(0, flat.reshape(-1), add.reshape(-1))


def leave_feed(
    feeds: torch.Tensor,
    feed_committed: torch.Tensor,
    slots: torch.Tensor,
    position: torch.Tensor,
    step: torch.Tensor,
    stops: torch.Tensor,
    accepted: torch.Tensor,
    committed: torch.Tensor,
) -> None:
    """Per row into its slot: the token committed last (committed[b, a]), the KV index and
    output index after the round (position + a + 1, step + a + 1), the columns kept (t0 and
    the accepted drafts up to the first stop id among the committed tokens, + 1), and the
    committed tokens with -1 past the accepted ones.

    Args:
        feeds: [4, S]; feed_committed: [S, W]; slots, position, step, accepted: [B] int64;
        stops: [B, N] int64 (-1 padded); committed: [B, W] int64.
    """
    num, width = committed.shape
    every = torch.arange(num, device=committed.device)
    hit = (committed[:, :, None] == stops[:, None, :]).any(dim=-1)  # [B, W]
    count = torch.arange(1, width + 1, device=committed.device).expand(num, width)
    first = torch.where(hit, count, width + 1).amin(dim=1)  # 1-based, W + 1: none
    kept = torch.minimum(accepted, first)
    landed_count = accepted + 1
    values = (committed[every, accepted], position + landed_count, step + landed_count, kept + 1)
    feeds.index_copy_(1, slots, torch.stack(values))
    landed = torch.where(count <= landed_count[:, None], committed, -1)
    feed_committed.index_copy_(0, slots, landed)


class Commit(NamedTuple):
    """What a round keeps of its verify, per row (B rows of W = k + 1 columns)."""

    committed: torch.Tensor  # [B, W] the drafts kept, then the target's token; 0 past them
    accepted: torch.Tensor  # [B] drafts kept (a)
    next_ids: torch.Tensor  # [B, W] the head pass's ids: d1..dk, t0, with column a the last token
    result: torch.Tensor  # [B, R] (a + 1, a, committed, zeros): the round's result rows
    gather: torch.Tensor  # [B] the head pass's row to draft on: b * W + a
    draft_position: torch.Tensor  # [B] that row's KV index: position + a


def round_commit(
    ids: torch.Tensor,
    position: torch.Tensor,
    header: int,
    result_width: int,
    *,
    target: torch.Tensor | None = None,
    committed: torch.Tensor | None = None,
    accepted: torch.Tensor | None = None,
) -> Commit:
    """The round's bookkeeping after its verify. With `target` (a greedy round: the target's
    token per column), the drafts kept are those equal to the target's token before them, up to
    the first that is not, and the committed tokens the target's up to column a; otherwise the
    verify's `committed` and `accepted` (a sampled round).

    Args:
        ids: [B, W] int64, t0 then the drafts d1..dk; position: [B] int64 (may be strided),
        each row's KV index of t0; header: result columns before the tokens (2); result_width:
        header + W at least. target / committed: [B, W] int64; accepted: [B] int64.
    """
    num, width = ids.shape
    if target is not None:
        passed = target[:, :-1] == ids[:, 1:]
        accepted = passed.to(torch.int64).cumprod(dim=1).sum(dim=1)
        cols = torch.arange(width, device=ids.device)
        committed = torch.where(cols[None, :] <= accepted[:, None], target, 0)
    assert committed is not None and accepted is not None
    every = torch.arange(num, device=ids.device)
    next_ids = torch.cat((ids[:, 1:], ids[:, :1]), dim=1)
    next_ids[every, accepted] = committed[every, accepted]
    result = torch.zeros((num, result_width), dtype=torch.int64, device=ids.device)
    result[:, 0] = accepted + 1
    result[:, 1] = accepted
    result[:, header : header + width] = committed
    return Commit(
        committed, accepted, next_ids, result, every * width + accepted, position + accepted
    )
