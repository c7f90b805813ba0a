"""Hostile request text against every endpoint of a live server: never a 5xx, always JSON errors.

A scripted model (tests/support/scripted_runner.py) sits behind the real engine, template,
tokenizer and HTTP server, so well-formed requests finish in milliseconds and the property-based
fuzz test below can afford a bounded number of cases per CI run. Bodies are sent as raw bytes
(http.client), so lone surrogate escapes, invalid UTF-8 and byte-order marks reach the server
exactly as a careless or hostile client would send them.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from e2e.serve_process import MODEL_ID, ServeProcess, serve

pytestmark = pytest.mark.e2e

HI = [{"role": "user", "content": "hi"}]
# One minimal valid body per POST endpoint; generation is capped so fuzz cases stay fast.
BASES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": MODEL_ID, "messages": HI, "max_tokens": 4},
    "/v1/messages": {"model": MODEL_ID, "messages": HI, "max_tokens": 4},
    "/v1/messages/count_tokens": {"model": MODEL_ID, "messages": HI},
    "/v1/responses": {"model": MODEL_ID, "input": "hi", "max_output_tokens": 4},
    "/v1/responses/input_tokens": {"model": MODEL_ID, "input": "hi"},
    "/v1/responses/compact": {"model": MODEL_ID, "input": "hi"},
}
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    with serve(scripted=True) as s:
        yield s


def post_raw(server: ServeProcess, path: str, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    conn = server.connection(timeout=60)
    try:
        conn.request("POST", path, body=raw, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def get_raw(server: ServeProcess, method: str, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = server.connection(timeout=60)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def check_error(path: str, status: int, headers: dict[str, str], payload: bytes) -> dict:
    """A 4xx with the spec's JSON error envelope for this path; returns the error object."""
    assert 400 <= status < 500, (status, payload[:300])
    assert headers["content-type"].startswith("application/json"), headers
    body = json.loads(payload)
    if path in ANTHROPIC:
        assert body["type"] == "error" and body["request_id"] == headers["request-id"]
        assert {"type", "message"} <= set(body["error"])
    else:
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert headers["x-request-id"].startswith("req-")
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return body["error"]


def with_field(path: str, field: str, value: Any) -> dict[str, Any]:
    body = dict(BASES[path])
    body[field] = value
    return body


def encode(body: Any) -> bytes:
    """Python's own encoder writes a lone surrogate as the escape `\\udXXX`, as clients do."""
    return json.dumps(body).encode()


LONE = "\ud800"
# (path, field, value): a lone surrogate in fields of every kind, on every endpoint.
SURROGATE_CASES = [
    ("/v1/chat/completions", "model", LONE),
    ("/v1/chat/completions", "messages", [{"role": "user", "content": "a" + LONE}]),
    ("/v1/chat/completions", "stop", [LONE]),
    ("/v1/messages", "model", LONE),
    ("/v1/messages", "system", LONE),
    ("/v1/messages", "metadata", {"user_id": LONE}),
    ("/v1/messages/count_tokens", "model", LONE),
    ("/v1/messages/count_tokens", "messages", [{"role": "user", "content": LONE}]),
    ("/v1/responses", "model", LONE),
    ("/v1/responses", "input", LONE),
    ("/v1/responses", "instructions", LONE),
    ("/v1/responses", "metadata", {"k": LONE}),
    ("/v1/responses", "metadata", {LONE: "v"}),
    ("/v1/responses", "prompt_cache_key", LONE),
    ("/v1/responses", "user", "\udfff"),
    ("/v1/responses/input_tokens", "instructions", LONE),
    ("/v1/responses/compact", "input", LONE),
]


@pytest.mark.parametrize("stream", [False, True], ids=["aggregate", "stream"])
@pytest.mark.parametrize(("path", "field", "value"), SURROGATE_CASES)
def test_lone_surrogates_are_a_400_naming_the_field(
    server: ServeProcess, path: str, field: str, value: Any, stream: bool
) -> None:
    body = with_field(path, field, value)
    if stream:
        body["stream"] = True
    error = check_error(path, *post_raw(server, path, encode(body)))
    assert error["code"] == "invalid_encoding"
    assert error["param"] is None or error["param"].startswith(field)


MALFORMED = [
    (b"\xef\xbb\xbf" + encode(BASES["/v1/chat/completions"]), "invalid_encoding"),
    (b'{"model": "\xff\xfe"}', "invalid_encoding"),
    (b'{"model": "\xed\xa0\x80"}', "invalid_encoding"),
    (b'{"model": "a\x00b"}', "invalid_json"),
    (b"\x00", "invalid_json"),
    (b"[" * 5000 + b"]" * 5000, "invalid_json"),
    (b'{"a":' * 200 + b"1" + b"}" * 200, "invalid_json"),
    (b'{"temperature": NaN}', "invalid_json"),
    (b"", "invalid_json"),
]


@pytest.mark.parametrize("path", sorted(BASES))
@pytest.mark.parametrize(("raw", "code"), MALFORMED, ids=[f"malformed{i}" for i in range(9)])
def test_malformed_bodies_are_a_400_on_every_endpoint(
    server: ServeProcess, path: str, raw: bytes, code: str
) -> None:
    error = check_error(path, *post_raw(server, path, raw))
    assert error["code"] == code


def test_nul_characters_are_text_not_errors(server: ServeProcess) -> None:
    body = with_field(
        "/v1/messages/count_tokens", "messages", [{"role": "user", "content": "a\0b"}]
    )
    status, _, payload = post_raw(server, "/v1/messages/count_tokens", encode(body))
    assert status == 200 and json.loads(payload)["input_tokens"] > 0


def test_no_stored_response_holds_unreadable_text(server: ServeProcess) -> None:
    rejected = with_field("/v1/responses", "input", [{"role": "user", "content": "x" + LONE}])
    check_error("/v1/responses", *post_raw(server, "/v1/responses", encode(rejected)))
    # A valid pair (an emoji written as escapes, as ASCII-only encoders do) is stored and listed.
    stored = with_field("/v1/responses", "input", [{"role": "user", "content": "x\U0001f600"}])
    status, _, payload = post_raw(server, "/v1/responses", encode(stored))
    assert status == 200
    response_id = json.loads(payload)["id"]
    status, headers, listing = get_raw(server, "GET", f"/v1/responses/{response_id}/input_items")
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert json.loads(listing)["data"][0]["content"][0]["text"] == "x\U0001f600"


# -- property-based fuzzing of every endpoint ---------------------------------------------------

HOSTILE_TEXT = st.sampled_from(
    [
        "\ud800",
        "\udfff",
        "a\ud83d",
        "\ufeff",
        "\x00",
        "\U0001f600",
        "é",
        "\\",
        "<think>",
        "<|im_end|>",
        "</tool_call>",
        "",
        " " * 3,
    ]  # fmt: skip
)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | HOSTILE_TEXT
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=6) | HOSTILE_TEXT, inner, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = st.sampled_from(
    [
        "model",
        "messages",
        "input",
        "instructions",
        "system",
        "tools",
        "tool_choice",
        "stream",
        "max_tokens",
        "max_output_tokens",
        "temperature",
        "stop",
        "metadata",
        "reasoning",
        "thinking",
        "chat_template_kwargs",
        "previous_response_id",
        "include",
        "text",
        "store",
        "stream_options",
        "parallel_tool_calls",
        "top_p",
        "user",
    ]  # fmt: skip
)
TOOL_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "description": "c"}}}
# Richer valid bodies: the fuzzer's edits land in string fields of every kind.
RICH: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        **BASES["/v1/chat/completions"],
        "messages": [{"role": "system", "content": "be brief"}, *HI],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": TOOL_PARAMS}}],
        "stop": ["zz"],
        "user": "u",
    },
    "/v1/messages": {
        **BASES["/v1/messages"],
        "system": [{"type": "text", "text": "be brief"}],
        "tools": [{"name": "f", "description": "d", "input_schema": TOOL_PARAMS}],
        "metadata": {"user_id": "u"},
        "stop_sequences": ["zz"],
    },
    "/v1/messages/count_tokens": {**BASES["/v1/messages/count_tokens"], "system": "be brief"},
    "/v1/responses": {
        **BASES["/v1/responses"],
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "instructions": "be brief",
        "metadata": {"k": "v"},
        "tools": [{"type": "function", "name": "f", "parameters": TOOL_PARAMS}],
        "prompt_cache_key": "p",
        "user": "u",
    },
    "/v1/responses/input_tokens": {**BASES["/v1/responses/input_tokens"], "instructions": "b"},
    "/v1/responses/compact": BASES["/v1/responses/compact"],
}


def _string_slots(value: Any, where: tuple = ()) -> list[tuple]:
    """Paths to every string value and every object key (marked with a trailing None)."""
    out: list[tuple] = []
    if isinstance(value, dict):
        for key, child in value.items():
            out.append((*where, key, None))
            out += _string_slots(child, (*where, key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out += _string_slots(child, (*where, i))
    elif isinstance(value, str):
        out.append(where)
    return out


def _poke(body: Any, slot: tuple, text: str) -> None:
    *parents, last = slot
    if last is None:  # rename a key
        *parents, key = parents
        node = body
        for step in parents:
            node = node[step]
        node[key + text] = node.pop(key)
        return
    node = body
    for step in parents:
        node = node[step]
    node[last] = node[last] + text


def _mutate_body(data: st.DataObject, path: str) -> bytes:
    body: dict[str, Any] = json.loads(json.dumps(RICH[path]))
    if data.draw(st.booleans(), label="stream"):
        body["stream"] = True
    for _ in range(data.draw(st.integers(1, 2), label="edits")):
        op = data.draw(st.sampled_from(["poke", "poke", "field", "drop"]), label="op")
        if op == "poke":
            slot = data.draw(st.sampled_from(_string_slots(body)), label="slot")
            _poke(body, slot, data.draw(HOSTILE_TEXT | st.text(max_size=4), label="text"))
        elif op == "field":
            body[data.draw(FIELDS, label="field")] = data.draw(JSON, label="value")
        else:
            body.pop(data.draw(st.sampled_from(sorted(body)), label="drop"))
    raw = encode(body)
    damage = data.draw(st.sampled_from(["none"] * 6 + ["bom", "byte", "cut", "deep"]))
    if damage == "bom":
        raw = b"\xef\xbb\xbf" + raw
    elif damage == "byte":
        at = data.draw(st.integers(0, len(raw)), label="at")
        raw = raw[:at] + data.draw(st.binary(min_size=1, max_size=2), label="bytes") + raw[at:]
    elif damage == "cut":
        raw = raw[: data.draw(st.integers(0, max(0, len(raw) - 1)), label="cut")]
    elif damage == "deep":
        depth = data.draw(st.integers(60, 3000), label="depth")
        raw = raw[:-1] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"
    return raw


@pytest.mark.parametrize("path", sorted(RICH))
def test_fuzz_seed_bodies_are_valid(server: ServeProcess, path: str) -> None:
    status, _, payload = post_raw(server, path, encode(RICH[path]))
    if path == "/v1/responses/compact":
        assert status == 400 and b"compaction_not_supported" in payload
    else:
        assert status == 200, payload[:300]


def _check_success(path: str, headers: dict[str, str], payload: bytes) -> None:
    kind = headers["content-type"]
    if kind.startswith("text/event-stream"):
        text = payload.decode("utf-8")  # a stream is valid UTF-8 throughout ...
        for line in text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                event = json.loads(line[6:])
                # ... and never reports a failure for a request it accepted
                assert "error" not in event or event["error"] is None, event
                assert event.get("type") not in ("error", "response.failed"), event
    else:
        assert kind.startswith("application/json")
        json.loads(payload)


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,  # the same cases every CI run; raise max_examples locally to explore
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_fuzz_every_endpoint_never_5xx(server: ServeProcess, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["post"] * 4 + ["get"]), label="kind")
    if kind == "post":
        path = data.draw(st.sampled_from(sorted(BASES)), label="path")
        status, headers, payload = post_raw(server, path, _mutate_body(data, path))
    else:
        ident = data.draw(st.text(max_size=6) | HOSTILE_TEXT, label="id")
        quoted = urllib.parse.quote(ident.encode("utf-8", "surrogatepass"), safe="")
        method, path = data.draw(
            st.sampled_from(
                [
                    ("GET", f"/v1/models/{quoted}"),
                    ("GET", f"/v1/responses/{quoted}"),
                    ("DELETE", f"/v1/responses/{quoted}"),
                    ("POST", f"/v1/responses/{quoted}/cancel"),
                    ("GET", f"/v1/responses/{quoted}/input_items?limit={quoted}&order={quoted}"),
                    ("GET", f"/{quoted}"),
                ]
            ),
            label="route",
        )
        status, headers, payload = get_raw(server, method, path)
    assert status < 500, (status, payload[:300])
    if status >= 400:
        check_error(path, status, headers, payload)
    else:
        _check_success(path, headers, payload)


@pytest.mark.parametrize(
    ("method", "path", "needle", "anthropic"),
    [
        ("POST", "/v1/completions", "send messages to /v1/chat/completions", False),
        ("POST", "/v1/embeddings", "embeddings are not supported", False),
        ("GET", "/v1/chat/completions/chatcmpl-1", "stored Chat Completions", False),
        ("POST", "/v1/files", "file storage is not supported", False),
        ("POST", "/v1/messages/batches", "Message Batches are not supported", True),
        ("GET", "/v1/messages/batches/msgbatch_1", "Message Batches are not supported", True),
        ("POST", "/v1/complete", "legacy Text Completions", True),
    ],
)
def test_unbuilt_endpoints_say_what_is_missing(
    server: ServeProcess, method: str, path: str, needle: str, anthropic: bool
) -> None:
    # An endpoint of the OpenAI or Anthropic API that ninfer does not build is a 404 naming it
    # and where to go instead, in the error shape of its API family; an unknown path stays a
    # plain "no such endpoint".
    status, headers, payload = get_raw(server, method, path)
    assert status == 404
    body = json.loads(payload)
    error = body["error"]
    assert error["code"] == "unsupported_endpoint" and path in error["message"]
    assert needle in error["message"]
    if anthropic:
        assert body["type"] == "error" and error["type"] == "not_found_error"
        assert body["request_id"] == headers["request-id"]
    else:
        assert error["type"] == "invalid_request_error" and "x-request-id" in headers
    status, _, payload = get_raw(server, "POST", "/v1/nothing-here")
    assert status == 404 and json.loads(payload)["error"]["code"] == "not_found"


def test_sdk_clients_see_the_unbuilt_endpoint_named(server: ServeProcess) -> None:
    import anthropic
    import openai

    oa = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="legacy text completions are not supported"):
        oa.completions.create(model="m", prompt="hi", max_tokens=1)
    with pytest.raises(openai.NotFoundError, match="embeddings are not supported"):
        oa.embeddings.create(model="m", input="hi")
    an = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.NotFoundError, match="Message Batches are not supported"):
        an.messages.batches.list()
