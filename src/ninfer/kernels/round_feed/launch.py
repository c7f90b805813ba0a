"""CUDA launcher of the round-feed kernels: `reference.take_feed` / `leave_feed` /
`round_commit` in one launch each (one thread per row), the twin's values exactly.

Imports torch and kernels.runtime. `take_problem` / `leave_problem` / `commit_problem` (the ops'
own signatures) name operands the kernels do not take (dispatch then runs the twin): int64 rows,
int64 feeds and committed tokens, int32 counts, at most MAX_ROWS rows.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt
from ninfer.kernels.round_feed.reference import Commit

OP = "round_feed"
MAX_ROWS = 1024  # one block
_INT64 = torch.int64


def take_problem(
    t0: torch.Tensor,
    position: torch.Tensor,
    step: torch.Tensor,
    chain: torch.Tensor,
    slots: torch.Tensor,
    feeds: torch.Tensor,
    feed_committed: torch.Tensor,
    counts: torch.Tensor,
) -> str | None:
    """Why `take_feed`'s kernel cannot take these operands, or None."""
    why = _problem([t0, position, step, chain, slots], feeds, feed_committed)
    if why is None and (counts.dtype != torch.int32 or not counts.is_contiguous()):
        why = f"counts must be contiguous int32, got {counts.dtype}"
    return why


def leave_problem(
    feeds: torch.Tensor,
    feed_committed: torch.Tensor,
    slots: torch.Tensor,
    position: torch.Tensor,
    step: torch.Tensor,
    stops: torch.Tensor,
    accepted: torch.Tensor,
    committed: torch.Tensor,
) -> str | None:
    """Why `leave_feed`'s kernel cannot take these operands, or None."""
    why = _problem([slots, position, step, stops, accepted, committed], feeds, feed_committed)
    if why is None and not (accepted.is_contiguous() and committed.is_contiguous()):
        why = "accepted and committed must be contiguous"
    if why is None and (committed.shape[1] != feed_committed.shape[1] or stops.stride(1) != 1):
        why = "committed must be as wide as the committed feed, stop rows dense"
    return why


def _problem(
    rows: list[torch.Tensor], feeds: torch.Tensor, feed_committed: torch.Tensor
) -> str | None:
    """What both kernels need. `rows`: the [B] (or [B, N]) per-row inputs; feeds [4, S] and
    feed_committed [S, W] must be contiguous int64."""
    num = rows[0].shape[0]
    if not 0 < num <= MAX_ROWS:
        return f"{num} rows; the kernels take 1..{MAX_ROWS}"
    if any(t.dtype != _INT64 or t.shape[0] != num for t in rows):
        return "per-row inputs must be int64 with one entry per row"
    if feeds.dtype != _INT64 or feed_committed.dtype != _INT64:
        return "feeds and committed tokens must be int64"
    if not (feeds.is_contiguous() and feed_committed.is_contiguous()) or feeds.shape[0] != 4:
        return "feeds [4, S] and committed tokens [S, W] must be contiguous"
    return None


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
    """See `reference.take_feed`."""
    device = rt.check_cuda(t0, position, step, chain, slots, feeds, feed_committed, counts)
    why = take_problem(t0, position, step, chain, slots, feeds, feed_committed, counts)
    if why is not None:
        raise rt.KernelInputError(why)
    num = t0.shape[0]
    kernel = rt.get_kernel(OP, "round_take_feed", device)
    args = (
        *_strided(t0, position, step, chain, slots),
        rt.ptr(feeds),
        rt.ptr(feed_committed),
        rt.ptr(counts),
        rt.i32(num),
        rt.i32(feeds.shape[1]),
        rt.i32(feed_committed.shape[1]),
        rt.i32(counts.shape[1]),
    )
    rt.launch(kernel, (1,), (_threads(num),), args, device)


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
    """See `reference.leave_feed`."""
    device = rt.check_cuda(feeds, feed_committed, slots, position, step, stops, accepted, committed)
    why = leave_problem(feeds, feed_committed, slots, position, step, stops, accepted, committed)
    if why is not None:
        raise rt.KernelInputError(why)
    num, width = committed.shape
    kernel = rt.get_kernel(OP, "round_leave_feed", device)
    args = (
        rt.ptr(feeds),
        rt.ptr(feed_committed),
        *_strided(slots, position, step, stops),
        rt.i32(stops.shape[1]),
        rt.ptr(accepted),
        rt.ptr(committed),
        rt.i32(num),
        rt.i32(feeds.shape[1]),
        rt.i32(width),
    )
    rt.launch(kernel, (1,), (_threads(num),), args, device)


def commit_problem(
    ids: torch.Tensor,
    position: torch.Tensor,
    header: int,
    result_width: int,
    *,
    target: torch.Tensor | None = None,
    committed: torch.Tensor | None = None,
    accepted: torch.Tensor | None = None,
) -> str | None:
    """Why `round_commit`'s kernel cannot take these operands, or None: int64 throughout, ids
    (and target or committed) contiguous [B, W], at most MAX_ROWS rows, the result wide enough,
    and either a target or the verify's committed and accepted."""
    num, width = ids.shape
    if not 0 < num <= MAX_ROWS:
        return f"{num} rows; the kernel takes 1..{MAX_ROWS}"
    if (target is None) == (committed is None or accepted is None):
        return "either a target or the verify's committed and accepted tokens"
    given = [t for t in (target, committed) if t is not None]
    if any(t.dtype != _INT64 for t in (ids, position, *given)) or (
        accepted is not None and accepted.dtype != _INT64
    ):
        return "ids, positions and tokens must be int64"
    if any(t.shape != (num, width) or not t.is_contiguous() for t in (ids, *given)):
        return "ids and tokens must be contiguous [B, W]"
    if position.shape != (num,) or (accepted is not None and accepted.shape != (num,)):
        return "positions and accepted counts must hold one entry per row"
    if accepted is not None and not accepted.is_contiguous():
        return "accepted counts must be contiguous"
    if result_width < header + width or header < 2:
        return f"a result row of {result_width} columns does not hold {header} + {width}"
    return None


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
    """See `reference.round_commit`."""
    device = rt.check_cuda(ids, position, target, committed, accepted)
    given = {"target": target, "committed": committed, "accepted": accepted}
    why = commit_problem(ids, position, header, result_width, **given)
    if why is not None:
        raise rt.KernelInputError(why)
    num, width = ids.shape
    if target is not None:
        committed = torch.empty_like(target)
        accepted = torch.empty(num, dtype=_INT64, device=device)
    assert committed is not None and accepted is not None
    next_ids = torch.empty_like(ids)
    result = torch.empty((num, result_width), dtype=_INT64, device=device)
    gather, draft_position = torch.empty((2, num), dtype=_INT64, device=device)
    args = (
        rt.ptr(target),
        rt.ptr(committed),
        rt.ptr(accepted),
        rt.ptr(ids),
        *_strided(position),
        rt.ptr(next_ids),
        rt.ptr(result),
        rt.ptr(gather),
        rt.ptr(draft_position),
        rt.i32(num),
        rt.i32(width),
        rt.i32(header),
        rt.i32(result_width),
    )
    kernel = rt.get_kernel(OP, "round_commit", device)
    rt.launch(kernel, (1,), (_threads(num),), args, device)
    return Commit(committed, accepted, next_ids, result, gather, draft_position)


def _strided(*tensors: torch.Tensor) -> list:
    """(pointer, row stride) of each per-row input, as the kernels take them."""
    out: list = []
    for t in tensors:
        out += [rt.ptr(t), rt.i64(t.stride(0))]
    return out


def _threads(num: int) -> int:
    return max(32, -(-num // 32) * 32)
