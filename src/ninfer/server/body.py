"""Request bodies: raw bytes -> one validated JSON value, the same strict rules for every endpoint.

No sanic import: routes hand over the request. Every string later layers see passed this gate, so
all of them may assume text that round-trips through UTF-8. Bodies above OFFLOAD_BYTES are
decoded and validated on a small worker pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ninfer.protocol.errors import ProtocolError

T = TypeVar("T")

MAX_DEPTH = 64  # JSON nesting allowed in a request body (tool schemas stay far below)
OFFLOAD_BYTES = 256 * 1024  # smaller bodies decode in well under a millisecond: inline
NUM_WORKERS = 2  # large bodies decoded at once; bounds the transient memory of decoding
BOM = b"\xef\xbb\xbf"
# A `\uD800`-`\uDFFF` escape anywhere in the raw text; only then can a decoded string hold a
# surrogate (strict UTF-8 decoding rejects encoded ones), so most bodies skip that check.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")

_pool: ThreadPoolExecutor | None = None


def body_error(message: str, code: str, param: str | None = None) -> ProtocolError:
    return ProtocolError(message, status=400, code=code, param=param)


def decode_json(raw: bytes) -> Any:
    """The body as a JSON value, or ProtocolError 400 naming what is wrong with its text.

    Rules: strict UTF-8 without a byte-order mark (RFC 8259 section 8.1); no lone UTF-16
    surrogate escape in any string or key; no NaN / Infinity / out-of-range numbers; at most
    MAX_DEPTH levels of nesting. `\\u0000` is a valid character and stays accepted.
    """
    if raw.startswith(BOM):
        raise body_error(
            "the request body starts with a UTF-8 byte-order mark; send JSON text without one",
            "invalid_encoding",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise body_error(
            f"the request body is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
            f"{exc.start})",
            "invalid_encoding",
        ) from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise _too_deep() from None
    except ValueError as exc:  # JSONDecodeError, NaN/Infinity, over-long integer literals
        where = f" at offset {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
        detail = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        if "integer string conversion" in detail:  # Python's own wording names its internals
            detail = f"an integer literal has more than {sys.get_int_max_str_digits()} digits"
        raise body_error(
            f"the request body is not valid JSON{where}: {detail}", "invalid_json"
        ) from None
    _check_value(value, check_strings=_SURROGATE_ESCAPE.search(text) is not None)
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _too_deep() -> ProtocolError:
    return body_error(f"the request body nests JSON deeper than {MAX_DEPTH} levels", "invalid_json")


def _check_value(value: Any, *, check_strings: bool) -> None:
    """One iterative walk: nesting depth, finite numbers and (when escapes exist) surrogates."""
    stack: list[tuple[Any, int]] = [([value], 0)]  # a virtual root holding the body
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise _too_deep()
        if isinstance(node, dict):
            if check_strings and any(_SURROGATE.search(key) for key in node):
                raise _surrogate_error(value)
            node = node.values()
        for child in node:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, depth + 1))
            elif kind is str:
                if check_strings and _SURROGATE.search(child):
                    raise _surrogate_error(value)
            elif kind is float and not math.isfinite(child):
                raise body_error(
                    "the request body holds a number outside the double range", "invalid_json"
                )


def _surrogate_error(value: Any) -> ProtocolError:
    path = _surrogate_path(value)
    return body_error(
        f"{path or 'body'}: contains a lone UTF-16 surrogate escape; strings must be valid "
        "Unicode text",
        "invalid_encoding",
        param=path or None,
    )


def _surrogate_path(value: Any, prefix: str = "") -> str:
    """The param path of the first string or key holding a surrogate (depth is already bounded)."""
    if isinstance(value, dict):
        for key, child in value.items():
            where = f"{prefix}.{key}" if prefix else str(key)
            if _SURROGATE.search(key):
                return prefix or "body"
            found = _surrogate_path(child, where)
            if found:
                return found
    elif isinstance(value, list):
        for i, child in enumerate(value):
            found = _surrogate_path(child, f"{prefix}[{i}]")
            if found:
                return found
    elif isinstance(value, str) and _SURROGATE.search(value):
        return prefix
    return ""


async def parse_body(request: Any, parse: Callable[[Any], T]) -> T:
    """`parse(decode_json(request.body))`, on a worker thread when the body is large.

    JSON decoding holds the GIL for its duration in C; the size limit bounds that pause (see
    docs/serving.md), while validation and the protocol parser yield to the loop as usual.
    """
    raw: bytes = request.body or b""
    if len(raw) < OFFLOAD_BYTES:
        return parse(decode_json(raw))
    return await off_loop(lambda: parse(decode_json(raw)))


async def off_loop_if_large(request: Any, fn: Callable[[], T]) -> T:
    """`fn()` (more work proportional to the body) inline for small bodies, else off the loop."""
    if len(request.body or b"") < OFFLOAD_BYTES:
        return fn()
    return await off_loop(fn)


async def off_loop(fn: Callable[[], T]) -> T:
    """Run `fn` on the body workers (at most NUM_WORKERS at once, FIFO)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(NUM_WORKERS, thread_name_prefix="ninfer-body")
    return await asyncio.get_running_loop().run_in_executor(_pool, fn)
