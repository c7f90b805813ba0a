"""Stop strings matched over a stream of committed text, across delta boundaries.

Owns withholding text that may be the start of a stop string and cutting the stream at the first
completed stop. Imports only the standard library. The stop that *completes* first wins (ties go
to the one that starts first): a streaming engine must halt at the first token that finishes a
stop, and matching whole text by the same rule keeps aggregate and streamed output identical.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["StopMatcher", "StopResult", "StopStringError"]


class StopStringError(ValueError):
    """A stop string that can never be matched meaningfully (empty or not a string)."""


class StopResult(NamedTuple):
    """Text that is safe to release now, and the stop string once one has matched."""

    text: str
    stop: str | None

    @property
    def stopped(self) -> bool:
        return self.stop is not None


class StopMatcher:
    """Feed committed text; get back what cannot be part of a stop, until a stop matches.

    The stop string itself and everything after it are dropped. Feed the text of each committed
    token in order and the call that reports `stopped` identifies the token that completed the
    stop (the engine commits through it). Text that may begin a stop is withheld and comes back
    from a later feed() or from flush() at the end of the output.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        for stop in stops:
            if not isinstance(stop, str) or not stop:
                raise StopStringError(f"stop strings must be non-empty strings, got {stop!r}")
        self._stops = tuple(dict.fromkeys(stops))
        self._held = ""
        self._matched: str | None = None

    @property
    def matched(self) -> str | None:
        """The stop string that ended the stream, or None."""
        return self._matched

    def feed(self, text: str) -> StopResult:
        if self._matched is not None:
            return StopResult("", self._matched)
        if not self._stops:
            return StopResult(text, None)
        buf = self._held + text
        best: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self._stops:
            start = buf.find(stop)
            if start >= 0 and (best is None or (start + len(stop), start) < best[:2]):
                best = (start + len(stop), start, stop)
        if best is not None:
            self._held = ""
            self._matched = best[2]
            return StopResult(buf[: best[1]], best[2])
        num_held = self._num_chars_to_hold(buf)
        self._held = buf[len(buf) - num_held :]
        return StopResult(buf[: len(buf) - num_held], None)

    def flush(self) -> str:
        """End of output without a stop: release the withheld text."""
        held, self._held = self._held, ""
        return held

    def _num_chars_to_hold(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            # Only a suffix shorter than the stop can be a proper prefix; try the longest first.
            at = buf.find(stop[0], max(0, len(buf) - len(stop) + 1))
            while at >= 0 and len(buf) - at > longest:
                if stop.startswith(buf[at:]):
                    longest = len(buf) - at
                    break
                at = buf.find(stop[0], at + 1)
        return longest
