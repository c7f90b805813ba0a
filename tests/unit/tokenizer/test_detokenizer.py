"""IncrementalDetokenizer: streamed pieces join to exactly `Tokenizer.decode`, for any split."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers

from ninfer.tokenizer import IncrementalDetokenizer, InvalidTokenIdError, Tokenizer
from ninfer.tokenizer.byte_level import spell

_SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
_TEXT = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(list("a 你好😀👍🏽\u200d\u0301é\n\ufffd")),
    ),
    max_size=30,
)


def _split(ids: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = sorted({min(cut, len(ids)) for cut in cuts} | {0, len(ids)})
    return [ids[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]


def _stream(tokenizer: Tokenizer, chunks: list[list[int]], skip: bool) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip)
    return [detok.push(chunk) for chunk in chunks] + [detok.flush()]


@st.composite
def _qwen_ids(draw, tokenizer: Tokenizer) -> list[int]:
    """Ids mixing real text, lone byte tokens (partial UTF-8), specials and padding rows."""
    byte_ids = [tokenizer.token_to_id(spell(bytes([b]))) for b in range(256)]
    piece = st.one_of(
        _TEXT.map(tokenizer.encode_text),
        st.lists(st.sampled_from(byte_ids), max_size=4),
        st.lists(st.integers(0, tokenizer.vocab_size + 300), max_size=3),
        st.lists(st.sampled_from(sorted(tokenizer.special_tokens.values())), max_size=2),
    )
    return [token_id for part in draw(st.lists(piece, max_size=6)) for token_id in part]


@_SETTINGS
@given(data=st.data(), skip=st.booleans())
def test_pieces_join_to_decode_for_any_split(qwen, data, skip):
    ids = data.draw(_qwen_ids(qwen))
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)))
    pieces = _stream(qwen, _split(ids, cuts), skip)
    assert "".join(pieces) == qwen.decode(ids, skip_special_tokens=skip)


@_SETTINGS
@given(text=_TEXT, data=st.data())
def test_valid_text_streams_without_broken_characters(qwen, text, data):
    ids = qwen.encode_text(text)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)))
    pieces = _stream(qwen, _split(ids, cuts), skip=False)
    assert "".join(pieces) == unicodedata.normalize("NFC", text)
    for piece in pieces:
        # A replacement character may only appear where the text itself has one.
        assert piece.count("\ufffd") <= text.count("\ufffd")


def test_emoji_split_across_byte_tokens_is_held_until_complete(qwen):
    emoji = "😀".encode()
    ids = [qwen.token_to_id(spell(bytes([b]))) for b in emoji]
    detok = IncrementalDetokenizer(qwen)
    assert [detok.push([i]) for i in ids] == ["", "", "", "😀"]
    assert detok.flush() == ""


def test_flush_emits_unfinished_character_as_replacement_and_resets(qwen):
    first_two = [qwen.token_to_id(spell(bytes([b]))) for b in "你".encode()[:2]]
    detok = IncrementalDetokenizer(qwen)
    assert detok.push(first_two) == ""
    assert detok.flush() == "\ufffd"
    assert detok.push(qwen.encode_text("ok")) == "ok"  # a fresh stream after flush


def test_skip_special_tokens_drops_control_tokens(qwen):
    ids = qwen.encode_template("<|im_start|>assistant\n<think>\nhm\n</think>\n\nHi<|im_end|>")
    detok = IncrementalDetokenizer(qwen, skip_special_tokens=True)
    assert "".join(detok.push([i]) for i in ids) + detok.flush() == "assistant\n\nhm\n\n\nHi"


@pytest.mark.parametrize("bad_id", [-1, 2**32])
def test_invalid_ids_raise(qwen, bad_id):
    with pytest.raises(InvalidTokenIdError):
        IncrementalDetokenizer(qwen).push([bad_id])


def _sentencepiece_style() -> Tokenizer:
    """A Llama-style tokenizer (Metaspace, byte fallback): no byte table, so the window path."""
    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for piece in ["▁", "a", "b", "▁a", "ab", "▁ab", "▁b"]:
        vocab[piece] = len(vocab)
    merges = [("▁", "a"), ("a", "b"), ("▁a", "b"), ("▁", "b")]
    hf = HFTokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    hf.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    hf.add_special_tokens(["<s>", "</s>"])
    return Tokenizer.from_json(hf.to_str())


@pytest.fixture(scope="module")
def sentencepiece() -> Tokenizer:
    return _sentencepiece_style()


@_SETTINGS
@given(
    segments=st.lists(st.text(alphabet=st.sampled_from(list("ab  é你😀")), max_size=8), max_size=4),
    data=st.data(),
    skip=st.booleans(),
)
def test_window_path_pieces_join_to_decode(sentencepiece, segments, data, skip):
    # Exact only for ids that spell valid text: HF's ByteFallback turns a whole invalid byte run
    # into one U+FFFD per byte, which no prefix-based stream can reproduce.
    assert sentencepiece.byte_table is None
    specials = sorted(sentencepiece.special_tokens.values())
    ids: list[int] = []
    for segment in segments:
        ids += sentencepiece.encode_text(segment) + data.draw(st.lists(st.sampled_from(specials)))
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)))
    pieces = _stream(sentencepiece, _split(ids, cuts), skip)
    assert "".join(pieces) == sentencepiece.decode(ids, skip_special_tokens=skip)
