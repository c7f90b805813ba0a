"""Prefix-cache write candidates of a rendered prompt, as token offsets for the engine.

Standard library only. The chat layer knows where a conversation's stable boundaries are: the
input checkpoint before the generation prologue (the last `<|im_start|>`: a later turn keeps
everything before it even when it re-renders this turn's reasoning differently), the implicit
candidate before the closing token of the latest content part, and the client's explicit
markers. The engine captures a checkpoint at each offset (and at the conversation's end).
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_MARKER_WRITES = 4  # spec (OpenAI prompt caching): at most four writes per request


def prompt_checkpoints(
    ids: Sequence[int],
    *,
    im_start: int | None,
    im_end: int | None,
    markers: Sequence[int | None] = (),
    implicit: bool = True,
) -> tuple[int, ...]:
    """Offsets (each the number of prompt tokens before the boundary), sorted and distinct.

    Markers are explicit boundaries already mapped to token offsets (None: not representable,
    ignored). Explicit markers take precedence: the latest four are kept, and the implicit
    candidate only fills a slot they leave. The input checkpoint is the engine's own and always
    requested.
    """
    n = len(ids)
    explicit = explicit_markers(markers, n)
    out = set(explicit)
    prologue = _last_index(ids, im_start, n) if im_start is not None else None
    if implicit and len(explicit) < MAX_MARKER_WRITES and im_end is not None:
        closing = _last_index(ids, im_end, prologue if prologue is not None else n)
        if closing is not None and closing > 0:
            out.add(closing)
    if prologue is not None and prologue > 0:
        out.add(prologue)
    return tuple(sorted(out))


def explicit_markers(markers: Sequence[int | None], n: int) -> list[int]:
    """The explicit markers a prompt of `n` tokens writes at: inside it, distinct, the latest
    MAX_MARKER_WRITES, sorted (the last one ends the request's cache creation)."""
    return sorted({m for m in markers if m is not None and 0 < m < n})[-MAX_MARKER_WRITES:]


def _last_index(ids: Sequence[int], token: int | None, end: int) -> int | None:
    for i in range(end - 1, -1, -1):
        if ids[i] == token:
            return i
    return None
