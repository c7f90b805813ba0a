"""The GPT-2 byte alphabet and the byte table, checked against HF's own ByteLevel decoder."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import decoders

from ninfer.tokenizer.byte_level import BYTE_TO_CHAR, CHAR_TO_BYTE, ByteTable, spell, unspell


def test_alphabet_is_a_bijection_with_gpt2_landmarks():
    assert len(set(BYTE_TO_CHAR)) == 256
    assert all(CHAR_TO_BYTE[char] == byte for byte, char in enumerate(BYTE_TO_CHAR))
    assert all(BYTE_TO_CHAR[byte] == chr(byte) for byte in range(ord("!"), ord("~") + 1))
    # GPT-2 landmarks: space "Ġ", newline "Ċ", NUL "Ā", DEL "ġ", NBSP "ł", soft hyphen "Ń".
    assert spell(b" \n\x00\x7f\xa0\xad") == "ĠĊĀġłŃ"
    assert not any(char.isspace() for char in BYTE_TO_CHAR)


@given(st.binary(max_size=64))
def test_unspell_inverts_spell(data):
    assert unspell(spell(data)) == data


_spellings = st.one_of(
    st.binary(max_size=6).map(spell),
    st.text(max_size=6),  # often outside the alphabet: HF falls back to the UTF-8 bytes
    st.sampled_from(["<|im_start|>", "é x", "Ġy", "ĠzÃ©", "\u0100\u0143", "tab\there"]),
)


@settings(max_examples=400)
@given(st.lists(_spellings, max_size=8))
def test_unspell_matches_hf_byte_level_decoder(tokens):
    expected = decoders.ByteLevel().decode(tokens)
    assert b"".join(unspell(token) for token in tokens).decode("utf-8", "replace") == expected


def test_byte_table_from_vocab_leaves_holes_empty_and_can_drop_specials():
    table = ByteTable.from_vocab({"a": 0, "Ġb": 2, "<s>": 4}, frozenset({4}))
    assert table.token_bytes == (b"a", b"", b" b", b"", b"<s>")
    assert table.without_special == (b"a", b"", b" b", b"", b"")
