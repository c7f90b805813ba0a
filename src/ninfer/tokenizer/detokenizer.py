"""Streaming detokenization: ids arrive a few at a time, text leaves as soon as it is complete.

Imports only this package. Byte-level vocabularies (Qwen) map each id to fixed bytes, fed to an
incremental UTF-8 decoder that holds an unfinished character: O(new ids), and the pieces join to
exactly `Tokenizer.decode(all_ids)`. Other decoders fall back to re-decoding a short id window.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from ninfer.tokenizer.errors import InvalidTokenIdError
from ninfer.tokenizer.tokenizer import Tokenizer

_MAX_ID = 2**32 - 1


class IncrementalDetokenizer:
    """One output stream. `flush()` ends it; pushing afterwards starts a fresh stream."""

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = False) -> None:
        table = tokenizer.byte_table
        if table is None:
            self._stream: _ByteStream | _WindowStream = _WindowStream(
                tokenizer, skip_special_tokens
            )
        else:
            token_bytes = table.without_special if skip_special_tokens else table.token_bytes
            self._stream = _ByteStream(token_bytes)

    def push(self, token_ids: Sequence[int]) -> str:
        """Text newly completed by `token_ids`; an unfinished UTF-8 character is held back."""
        return self._stream.push(token_ids)

    def flush(self) -> str:
        """Whatever is held at the end of the stream (an unfinished character as U+FFFD)."""
        return self._stream.flush()


class _ByteStream:
    def __init__(self, token_bytes: tuple[bytes, ...]) -> None:
        self._token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_ids: Sequence[int]) -> str:
        table = self._token_bytes
        num_known = len(table)
        chunks = []
        for token_id in token_ids:
            if 0 <= token_id < num_known:
                chunks.append(table[token_id])
            elif not 0 <= token_id <= _MAX_ID:
                raise InvalidTokenIdError(token_id)
            # else: an id past the vocabulary (embedding padding row) decodes to nothing, as in HF
        return self._utf8.decode(b"".join(chunks))

    def flush(self) -> str:
        return self._utf8.decode(b"", final=True)  # final=True also resets the decoder


class _WindowStream:
    """Re-decodes [ids of the previous emission] + pending ids; that context keeps decoders that
    depend on neighbours (leading-space stripping, byte-fallback runs) right. Exact for ids that
    spell valid text; each id is decoded a bounded number of times, so O(new ids) amortised."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._window: list[int] = []  # context ids (already emitted) + pending ids
        self._num_context = 0
        self._context_text = ""

    def push(self, token_ids: Sequence[int]) -> str:
        if not token_ids:
            return ""
        self._window.extend(token_ids)
        text = self._decode(self._window)
        if text.endswith("\ufffd"):
            return ""  # maybe an unfinished byte sequence: wait for more ids (or flush)
        out = text[len(self._context_text) :]
        if not out:
            return ""  # e.g. skipped specials: keep the old context, it still has text to lean on
        self._window = self._window[self._num_context :]
        self._num_context = len(self._window)
        self._context_text = self._decode(self._window)
        return out

    def flush(self) -> str:
        out = ""
        if len(self._window) > self._num_context:
            out = self._decode(self._window)[len(self._context_text) :]
        self._window, self._num_context, self._context_text = [], 0, ""
        return out

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)
