"""The output side of one request: commit decisions, UTF-8-safe text and stop strings.

A sampled token is pending until `OutputState.commit` looks at it: a stop token id or a stop
string finishes the request (the token is committed and counted; its text, and any text from the
stop string on, is withheld), and so do max_tokens and max_context. Text that could still begin a
stop string is held back until it is unambiguous, so no client ever sees a partial stop.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.engine.request import FinishReason
from ninfer.engine.stops import StopMatcher
from ninfer.tokenizer import IncrementalDetokenizer, Tokenizer


@dataclass(frozen=True)
class Commit:
    text: str
    finish: FinishReason | None


class OutputState:
    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        stop_token_ids: frozenset[int],
        stop_strings: tuple[str, ...],
        max_tokens: int,
        max_context: int,
    ) -> None:
        self._detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
        self._stops = StopMatcher(stop_strings)
        self._stop_ids = stop_token_ids
        self._max_tokens = max_tokens
        self._max_context = max_context

    @property
    def stop_token_ids(self) -> frozenset[int]:
        return self._stop_ids

    def commit(self, token_id: int, num_output: int, num_total: int) -> Commit:
        """Account for a committed token; `num_output` / `num_total` already include it."""
        if token_id in self._stop_ids:
            return Commit(self._flush(), FinishReason.STOP)
        result = self._stops.feed(self._detok.push([token_id]))
        if result.stopped:
            return Commit(result.text, FinishReason.STOP)
        if num_output >= self._max_tokens:
            return Commit(result.text + self._flush(), FinishReason.LENGTH)
        if num_total >= self._max_context:
            return Commit(result.text + self._flush(), FinishReason.CONTEXT)
        return Commit(result.text, None)

    def commit_control(self, token_ids: tuple[int, ...]) -> str:
        """Account for inserted control tokens; returns their text plus any held model text.

        Control text is not model output, so no stop string is matched in it (a stop could
        otherwise cut the suffix apart); text held as a possible stop start is released first.
        The caller guarantees the limits leave room (the capacity check at submission).
        """
        held = self._stops.flush()
        return held + self._detok.push(list(token_ids))

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the output, or None."""
        return self._stops.matched

    def finish(self) -> str:
        """The request ends for an outside reason: release whatever text is still held."""
        return self._flush()

    def _flush(self) -> str:
        tail = self._detok.flush()
        result = self._stops.feed(tail)
        return result.text + ("" if result.stopped else self._stops.flush())
