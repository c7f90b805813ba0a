"""Long text is encoded in pieces at SAFE_CUT points; the ids must equal whole-text encoding.

The reference is HF `tokenizers` encoding the whole string in one call (the pre-piecewise
behaviour). Pieces are made tiny here so that almost every cut point is exercised.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.tokenizer import Tokenizer
from ninfer.tokenizer import tokenizer as tokenizer_module


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.qwen3_5()


def whole(tok: Tokenizer, text: str) -> list[int]:
    return tok._text_mode.encode(text, add_special_tokens=False).ids


# Characters that meet at cut points, plus ones that interact with NFC and the split regex:
# combining marks, contractions, CJK, emoji, CR, tabs, punctuation runs, control spellings.
ALPHABET = [
    *"aZ09 \n\r\t'.,-_!?(){}[]:;\"/\\@#$%^&*~`|<>=+",
    *["s", "ll", "'re", "é", "e\u0301", "\u0301", "漢", "字", "\U0001f600", "<|im_end|>"],
    *["<think>", "\u00a0", "١٢", "Ⅻ", "ﬁ", "。", "\u1100", "\u1161", "\u11a8", "\u0b47"],
    *["\u0b3e", "\u2028", "\x85", "\x1c", "\u3000", "²", "\u200b", "\ufeff"],
]


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(ALPHABET), max_size=120), piece=st.integers(1, 9))
def test_piecewise_ids_equal_whole_text_ids(tok: Tokenizer, parts: list[str], piece: int) -> None:
    text = "".join(parts)
    saved = tokenizer_module.PIECE_CHARS
    tokenizer_module.PIECE_CHARS = piece
    try:
        assert tok.encode_text(text) == whole(tok, text)
    finally:
        tokenizer_module.PIECE_CHARS = saved


def test_real_text_with_tiny_pieces(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (
        "def add(a, b):\n    return a + b\n\nThe year 2025 had 365 days; it's\nNew text "
        "with numbers 1234567890 and words like don't, we'll.\nZeta\n\nAlpha beta gamma.\n"
    ) * 20
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 5)
    assert tok.encode_text(text) == whole(tok, text)


def test_pieces_are_used_for_long_text(tok: Tokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = tokenizer_module._encode

    def spy(hf, text):  # type: ignore[no-untyped-def]
        seen.append(len(text))
        return real(hf, text)

    monkeypatch.setattr(tokenizer_module, "_encode", spy)
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 100)
    text = "word " * 100 + "1" * 300
    assert tok.encode_text(text) == whole(tok, text)
    assert len(seen) > 3 and max(seen) <= 105  # a cut comes within one word


def test_other_pipelines_are_never_cut() -> None:
    assert not tokenizer_module._is_qwen_text_pipeline('{"normalizer": null}')
    json_text = Tokenizer.qwen3_5().to_json()
    assert tokenizer_module._is_qwen_text_pipeline(json_text)
    assert not tokenizer_module._is_qwen_text_pipeline(
        json_text.replace('"type":"NFC"', '"type":"NFKC"', 1)
    )


def test_uncuttable_huge_text_is_encoded_under_the_process_lock(
    tok: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    held: list[tuple[int, bool]] = []
    real = tokenizer_module._encode

    def spy(hf, text):  # type: ignore[no-untyped-def]
        held.append((len(text), tokenizer_module._huge_pieces.locked()))
        return real(hf, text)

    monkeypatch.setattr(tokenizer_module, "_encode", spy)
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 10)
    monkeypatch.setattr(tokenizer_module, "HUGE_PIECE_CHARS", 40)
    word = "ab" * 50  # one letter run: no cut point
    assert tok.encode_text("cut here. " * 3 + word) == whole(tok, "cut here. " * 3 + word)
    assert all(locked == (size > 40) for size, locked in held)
    assert any(locked for _, locked in held) and not tokenizer_module._huge_pieces.locked()
