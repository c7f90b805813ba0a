"""The one body-decoding gate: strict UTF-8 JSON text, no lone surrogates, bounded nesting."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.protocol.errors import ProtocolError
from ninfer.server.body import MAX_DEPTH, OFFLOAD_BYTES, decode_json, parse_body


def rejected(raw: bytes) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode_json(raw)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"model": "\\ud800"}', "model"),
        (b'{"a": [1, {"b": "x\\uDFFFy"}]}', "a[1].b"),
        (b'{"a": {"\\ud83d": 1}}', "a"),  # a key
        (b'{"a": "\\ude00\\ud83d"}', "a"),  # a low before a high is two lone halves
        (b'"\\udbff"', None),
    ],
)
def test_lone_surrogate_escapes_are_rejected_naming_the_field(raw: bytes, param: str) -> None:
    error = rejected(raw)
    assert error.code == "invalid_encoding" and error.param == param
    assert "surrogate" in error.message


def test_surrogate_pairs_and_escaped_backslashes_are_text() -> None:
    assert decode_json(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}
    assert decode_json(b'{"a": "\\\\ud800"}') == {"a": "\\ud800"}  # a backslash, then text
    assert decode_json(b'{"a": "a\\u0000b"}') == {"a": "a\x00b"}  # NUL is a character


@pytest.mark.parametrize(
    ("raw", "code", "needle"),
    [
        (b'\xef\xbb\xbf{"a": 1}', "invalid_encoding", "byte-order mark"),
        (b'{"a": "\xff"}', "invalid_encoding", "0xff at offset 7"),
        (b'{"a": "\xed\xa0\x80"}', "invalid_encoding", "UTF-8"),  # an encoded surrogate
        (b'{"a": "\x00"}', "invalid_json", "JSON"),  # a raw control character
        (b'{"a": 1}\x00', "invalid_json", "JSON"),
        (b"", "invalid_json", "JSON"),
        (b'{"a": NaN}', "invalid_json", "NaN"),
        (b'{"a": -Infinity}', "invalid_json", "Infinity"),
        (b'{"a": 1e999}', "invalid_json", "double"),
        (b'{"a": ' + b"9" * 5000 + b"}", "invalid_json", "integer literal has more than 4300"),
        (b"[" * 100_000 + b"]" * 100_000, "invalid_json", "deeper"),
    ],
)
def test_malformed_text_is_a_400_with_a_code(raw: bytes, code: str, needle: str) -> None:
    error = rejected(raw)
    assert error.code == code
    assert needle in error.message


def nested(depth: int) -> bytes:
    return b'{"a": ' * (depth - 1) + b"[]" + b"}" * (depth - 1)


def test_nesting_limit_is_exact() -> None:
    assert decode_json(nested(MAX_DEPTH)) is not None
    assert "deeper" in rejected(nested(MAX_DEPTH + 1)).message


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values, st.booleans())
def test_valid_json_round_trips(value: Any, ascii_only: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    has_surrogate = any(0xD800 <= ord(c) <= 0xDFFF for c in json.dumps(value, ensure_ascii=False))
    if has_surrogate:
        assert rejected(raw).code == "invalid_encoding"
    else:
        assert decode_json(raw) == value


class Request(SimpleNamespace):
    body: bytes


def test_large_bodies_decode_off_the_event_loop() -> None:
    seen: list[str] = []

    def parse(value: Any) -> Any:
        seen.append(threading.current_thread().name)
        return value

    small = Request(body=b'{"a": 1}')
    large = Request(body=json.dumps({"a": "x" * OFFLOAD_BYTES}).encode())
    assert asyncio.run(parse_body(small, parse)) == {"a": 1}
    assert asyncio.run(parse_body(large, parse))["a"] == "x" * OFFLOAD_BYTES
    assert seen[0] == threading.current_thread().name
    assert seen[1].startswith("ninfer-body")


def test_errors_from_the_worker_reach_the_caller() -> None:
    large = Request(body=b'{"a": "' + b"x" * OFFLOAD_BYTES + b'\\ud800"}')
    with pytest.raises(ProtocolError) as info:
        asyncio.run(parse_body(large, lambda v: v))
    assert info.value.param == "a"
