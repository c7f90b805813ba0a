"""CUDA launcher of the round-feed kernels: `reference.take_feed` / `leave_feed` in one launch
each (one thread per row), the twin's values exactly.

Imports torch and kernels.runtime. `take_problem` / `leave_problem` (the ops' own signatures) name
operands the kernels do not take (dispatch then runs the twin): int64 rows, int64 feeds and
committed tokens, int32 counts, at most MAX_ROWS rows.
"""

from __future__ import annotations

import torch

from ninfer.kernels import runtime as rt

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


def _strided(*tensors: torch.Tensor) -> list:
    """(pointer, row stride) of each per-row input, as the kernels take them."""
    out: list = []
    for t in tensors:
        out += [rt.ptr(t), rt.i64(t.stride(0))]
    return out


def _threads(num: int) -> int:
    return max(32, -(-num // 32) * 32)
