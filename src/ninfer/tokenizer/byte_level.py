"""GPT-2's byte-to-unicode alphabet: how byte-level BPE vocabularies spell raw bytes as text.

Owns the two-way mapping and the per-id byte table used for streaming. Imports nothing from ninfer.
`unspell` follows HF's ByteLevel decoder exactly (a spelling with any character outside the alphabet
stands for its own UTF-8 bytes), so byte streams built here decode like HF's `decode`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property


def _byte_to_char() -> tuple[str, ...]:
    # Printable latin-1 bytes spell themselves; the other 68 (controls, space, NBSP, soft hyphen)
    # take U+0100 onwards in byte order, so every spelling is visible and whitespace-free.
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\N{INVERTED EXCLAMATION MARK}"), ord("\N{NOT SIGN}") + 1),
        *range(ord("\N{REGISTERED SIGN}"), ord("\N{LATIN SMALL LETTER Y WITH DIAERESIS}") + 1),
    ]
    chars = [""] * 256
    for byte in printable:
        chars[byte] = chr(byte)
    num_shifted = 0
    for byte in range(256):
        if not chars[byte]:
            chars[byte] = chr(256 + num_shifted)
            num_shifted += 1
    return tuple(chars)


BYTE_TO_CHAR: tuple[str, ...] = _byte_to_char()
CHAR_TO_BYTE: dict[str, int] = {char: byte for byte, char in enumerate(BYTE_TO_CHAR)}

# Maps each alphabet character to the latin-1 character of its byte, and every latin-1 character
# that is NOT in the alphabet to U+FFFF, so `.encode("latin-1")` fails exactly on foreign spellings.
_UNSPELL = {ord(char): chr(byte) for char, byte in CHAR_TO_BYTE.items()}
_UNSPELL.update({code: "\uffff" for code in range(256) if chr(code) not in CHAR_TO_BYTE})


def spell(data: bytes) -> str:
    """Writes raw bytes in the byte-level alphabet, the form HF vocabularies and merges use."""
    return "".join([BYTE_TO_CHAR[byte] for byte in data])


def unspell(spelling: str) -> bytes:
    """The bytes a vocabulary spelling contributes to HF ByteLevel decoding."""
    try:
        return spelling.translate(_UNSPELL).encode("latin-1")
    except UnicodeEncodeError:
        return spelling.encode("utf-8")


@dataclass(frozen=True)
class ByteTable:
    """Per-id bytes of a byte-level tokenizer: what streaming detokenization concatenates.

    `token_bytes[i]` is b"" for ids the tokenizer does not know (HF decode drops those too).
    """

    token_bytes: tuple[bytes, ...]
    special_ids: frozenset[int]

    @classmethod
    def from_vocab(cls, vocab: Mapping[str, int], special_ids: frozenset[int]) -> ByteTable:
        """Builds the table from every spelling -> id pair, added tokens included."""
        size = max(vocab.values(), default=-1) + 1
        token_bytes = [b""] * size
        for spelling, token_id in vocab.items():
            token_bytes[token_id] = unspell(spelling)
        return cls(tuple(token_bytes), special_ids)

    @cached_property
    def without_special(self) -> tuple[bytes, ...]:
        """The table with special ids mapped to b"", for `skip_special_tokens` streams."""
        token_bytes = list(self.token_bytes)
        for token_id in self.special_ids:
            token_bytes[token_id] = b""
        return tuple(token_bytes)
