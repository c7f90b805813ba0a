"""Anthropic Messages end to end: the official anthropic SDK and raw SSE against a live server.

Most tests use the scripted model (exact reasoning, tool calls, stops, long thinking) behind the
real engine and server; the thinking-budget default runs on the real demo model (random weights
never close `</think>` by themselves) through `ninfer serve --default-thinking-budget`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from e2e.serve_process import MODEL_ID, ServeProcess, serve, sse_events
from ninfer.artifact.demo import ensure_demo
from ninfer.artifact.reader import Artifact
from ninfer.engine.errors import QueueTimeout, ServerOverloaded
from ninfer.engine.thinking_budget import GUIDANCE, ThinkingControl
from ninfer.server.anthropic_routes import anthropic_error
from ninfer.tokenizer import Tokenizer

pytestmark = pytest.mark.e2e
MESSAGES = "/v1/messages"
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Weather forecast",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
}
GUIDANCE_TEXT = GUIDANCE.strip()
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    with serve(scripted=True) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    artifact = Artifact(ensure_demo())
    try:
        return Tokenizer.from_json(artifact.tokenizer_json)
    finally:
        artifact.close()


def _ask(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def _post_sse(server: ServeProcess, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    conn = server.connection()
    data = json.dumps({**body, "stream": True})
    conn.request("POST", MESSAGES, body=data, headers=JSON)
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("request-id")
    assert resp.getheader("content-type", "").startswith("text/event-stream")
    events, name = [], None
    for line in sse_events(resp):
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            events.append((name, json.loads(line[len("data: ") :])))
            name = None
    conn.close()
    return events


def _replay(events: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Validate the event lifecycle one event at a time; return the blocks it builds."""
    assert all(data["type"] == name for name, data in events)
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    assert events[0][1]["message"]["content"] == []
    blocks: list[dict[str, Any]] = []
    is_open = False
    for name, data in events[2:-2]:
        if name == "ping":
            continue
        if name == "content_block_start":
            assert not is_open and data["index"] == len(blocks)
            blocks.append(dict(data["content_block"]))
            blocks[-1]["partial"] = ""
            is_open = True
            continue
        assert is_open and data["index"] == len(blocks) - 1, (name, data)
        block = blocks[-1]
        if name == "content_block_stop":
            is_open = False
            if block["type"] == "thinking":
                assert block["signature"], "a thinking block closes only after signature_delta"
            if block["type"] == "tool_use":
                block["input"] = json.loads(block["partial"]) if block["partial"] else {}
            del block["partial"]
            continue
        assert name == "content_block_delta"
        delta = data["delta"]
        assert not (block["type"] == "thinking" and block["signature"]), "delta after signature"
        kind = delta["type"]
        if kind == "thinking_delta":
            assert block["type"] == "thinking"
            block["thinking"] += delta["thinking"]
        elif kind == "signature_delta":
            block["signature"] = delta["signature"]
        elif kind == "text_delta":
            assert block["type"] == "text"
            block["text"] += delta["text"]
        else:
            assert kind == "input_json_delta" and block["type"] == "tool_use"
            block["partial"] += delta["partial_json"]
    assert not is_open
    return blocks


def _without_ids(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in b.items() if k not in ("id", "citations")} for b in blocks]


# -- aggregate and streamed messages -------------------------------------------------------------


def test_sdk_aggregate_thinking_and_text(client: anthropic.Anthropic) -> None:
    raw = client.messages.with_raw_response.create(
        model="claude-local-proxy", max_tokens=200, messages=_ask("REASON please")
    )
    assert raw.headers.get("request-id") and "x-request-id" not in raw.headers
    msg = raw.parse()
    assert msg.model == "claude-local-proxy" and msg.role == "assistant"
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == "Let me think about it." and msg.content[0].signature
    assert msg.content[1].text == "The answer is 42."
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    count = client.messages.count_tokens(model="x", messages=_ask("REASON please"))
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == count.input_tokens
    assert msg.usage.output_tokens > 0


def test_stream_lifecycle_matches_aggregate(server: ServeProcess, client) -> None:
    body = {"model": MODEL_ID, "max_tokens": 200, "messages": _ask("REASON please")}
    events = _post_sse(server, body)
    blocks = _replay(events)
    aggregate = client.messages.create(**body)
    assert blocks == [b.model_dump(exclude_none=True) for b in aggregate.content]
    final = events[-2][1]
    assert final["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert final["usage"] == aggregate.usage.model_dump(
        exclude_none=False, include=final["usage"].keys()
    )
    assert events[0][1]["message"]["usage"]["input_tokens"] == aggregate.usage.input_tokens
    # the SDK's own stream accumulator agrees
    with client.messages.stream(**body) as stream:
        sdk_final = stream.get_final_message()
    assert _without_ids([b.model_dump() for b in sdk_final.content]) == _without_ids(
        [b.model_dump() for b in aggregate.content]
    )


def test_tool_use_round_trip_aggregate_and_streamed(server, client) -> None:
    first = client.messages.create(
        model=MODEL_ID, max_tokens=300, messages=_ask("WEATHER? in Paris"), tools=[WEATHER_TOOL]
    )
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    call = first.content[1]
    assert call.name == "get_weather" and call.input == {"city": "Paris", "days": 3}
    assert call.id.startswith("toolu_")
    history = [
        *_ask("WEATHER? in Paris"),
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call.id, "content": "TOOL_RESULT_SUNNY"}
            ],
        },
    ]
    second = client.messages.create(
        model=MODEL_ID, max_tokens=300, messages=history, tools=[WEATHER_TOOL]
    )
    assert second.stop_reason == "end_turn"
    assert second.content[-1].type == "text" and second.content[-1].text == "It is sunny in Paris."
    body = {"model": MODEL_ID, "max_tokens": 300, "messages": _ask("WEATHER?")}
    events = _post_sse(server, {**body, "tools": [WEATHER_TOOL]})
    blocks = _replay(events)
    assert [b["type"] for b in blocks] == ["thinking", "tool_use"]
    assert blocks[1]["input"] == {"city": "Paris", "days": 3}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_stop_sequence_is_reported(client) -> None:
    msg = client.messages.create(
        model=MODEL_ID, max_tokens=100, messages=_ask("STOPWORD"), stop_sequences=["STOP"]
    )
    assert msg.content[-1].text == "alpha beta "
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "STOP")


def test_prefill_continues_the_assistant_text(client) -> None:
    messages = [*_ask("CONTINUE_ME"), {"role": "assistant", "content": "Sure:"}]
    msg = client.messages.create(model=MODEL_ID, max_tokens=100, messages=messages)
    assert [(b.type, b.text) for b in msg.content] == [("text", " and continued.")]
    count = client.messages.count_tokens(model=MODEL_ID, messages=messages)
    assert msg.usage.input_tokens == count.input_tokens
    # the prompt is the closed-thinking generation prompt plus the prefill text, left open
    opened = client.messages.count_tokens(
        model=MODEL_ID, messages=_ask("CONTINUE_ME"), thinking={"type": "disabled"}
    )
    assert count.input_tokens == opened.input_tokens + 2  # "Sure" ":"


def test_count_tokens_equals_engine_prompt_for_system_tools_and_history(client) -> None:
    body = {
        "model": MODEL_ID,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1"},
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
        ],
        "tools": [WEATHER_TOOL],
        "messages": [
            *_ask("first"),
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "CONTINUE_ME"}]},
        ],
        "thinking": {"type": "disabled"},
    }
    count = client.messages.count_tokens(**body)
    msg = client.messages.create(max_tokens=50, **body)
    u = msg.usage  # the system marker's prefix is created in the cache: the three add up
    assert u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens == (
        count.input_tokens
    )
    assert u.cache_creation_input_tokens > 0 and u.input_tokens < count.input_tokens
    assert [b.type for b in msg.content] == ["text"]  # thinking disabled: no thinking block
    without_billing = {**body, "system": body["system"][1:]}
    assert client.messages.count_tokens(**without_billing).input_tokens == count.input_tokens


# -- thinking budget (scripted: Anthropic budget_tokens) -----------------------------------------


def test_budget_tokens_cap_inserts_guidance_at_exactly_n(client, tokenizer) -> None:
    budget, max_tokens = 1024, 1100
    num_suffix = len(_control(tokenizer).suffix_ids)
    msg = client.messages.create(
        model=MODEL_ID,
        max_tokens=max_tokens,
        messages=_ask("BUDGETED"),
        thinking={"type": "enabled", "budget_tokens": budget},
    )
    script = tokenizer.encode_template("<think>\n" + " ".join(["step"] * 1500))
    thinking, text = msg.content
    # the first `budget` output tokens are the model's; the guidance follows them at once
    assert thinking.thinking == tokenizer.decode(script[1:budget]).lstrip("\n") + GUIDANCE
    assert text.text == tokenizer.decode(script[budget + num_suffix : max_tokens])
    assert msg.usage.output_tokens == max_tokens  # inserted tokens count
    assert msg.stop_reason == "max_tokens"


def test_budget_tokens_cap_streamed(server: ServeProcess, client) -> None:
    body = {
        "model": MODEL_ID,
        "max_tokens": 1100,
        "messages": _ask("BUDGETED"),
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    events = _post_sse(server, body)
    blocks = _replay(events)
    aggregate = client.messages.create(**body)
    assert blocks == [b.model_dump(exclude_none=True) for b in aggregate.content]
    assert blocks[0]["thinking"].endswith(GUIDANCE)
    assert events[-2][1]["usage"]["output_tokens"] == 1100


def test_context_exhaustion_stop_reason(client) -> None:
    long_prompt = _ask("LONG " + "pad " * 100)  # with ~2000 scripted words: past 2048
    msg = client.messages.create(model=MODEL_ID, max_tokens=4000, messages=long_prompt)
    assert msg.stop_reason == "model_context_window_exceeded"
    assert msg.usage.input_tokens + msg.usage.output_tokens == 2048  # the scripted max_context


def test_budget_capacity_rejection_at_the_boundary(server: ServeProcess, tokenizer) -> None:
    budget = 1024
    num_suffix = len(_control(tokenizer).suffix_ids)
    body = {"model": MODEL_ID, "messages": _ask("BUDGETED")}
    body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    status, headers, err = server.request(
        "POST", MESSAGES, {**body, "max_tokens": budget + num_suffix}
    )
    assert status == 400
    assert err["error"]["code"] == "thinking_budget_capacity_insufficient"
    assert err["error"]["type"] == "invalid_request_error"
    assert err["request_id"] == headers["request-id"]
    status, _, ok = server.request(
        "POST", MESSAGES, {**body, "max_tokens": budget + num_suffix + 1}
    )
    assert status == 200 and ok["usage"]["output_tokens"] == budget + num_suffix + 1


def _control(tokenizer: Tokenizer) -> ThinkingControl:
    control = ThinkingControl.from_tokenizer(tokenizer)
    assert control is not None
    return control


PNG = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "param", "code"),
    [
        ({"max_tokens": 0}, "max_tokens", "unsupported_value"),
        ({"thinking": {"type": "adaptive", "display": "omitted"}}, "thinking.display", None),
        ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "thinking.budget_tokens", None),
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": PNG}]}]},
            "messages[0].content[0]",
            "vision_disabled",
        ),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "any"}}, "tool_choice.type", None),
        ({"stop_sequences": "STOP"}, "stop_sequences", "invalid_type"),
    ],
)
def test_rejections_are_anthropic_errors_with_request_id(server, patch, param, code) -> None:
    body = {"model": MODEL_ID, "max_tokens": 10, "messages": _ask("hi"), **patch}
    status, headers, err = server.request("POST", MESSAGES, body)
    assert status == 400
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert err["error"]["param"] == param and param in err["error"]["message"]
    if code is not None:
        assert err["error"]["code"] == code
    assert err["request_id"] == headers["request-id"] and "x-request-id" not in headers


def test_sdk_raises_typed_errors(client) -> None:
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL_ID, max_tokens=0, messages=_ask("hi"))
    assert info.value.request_id and "max_tokens" in str(info.value)


def test_overload_is_529_and_queue_timeout_504() -> None:
    assert anthropic_error(QueueTimeout("late")).status == 504
    assert anthropic_error(ServerOverloaded("busy")).status == 529
    args = ("--max-concurrency", "1", "--max-pending-requests", "0", "--step-delay", "0.05")
    with serve(*args, scripted=True) as busy:
        conn = busy.connection()
        body = {"model": MODEL_ID, "max_tokens": 500, "messages": _ask("LONG"), "stream": True}
        conn.request("POST", MESSAGES, body=json.dumps(body), headers=JSON)
        resp = conn.getresponse()
        for line in sse_events(resp):  # the first request is running once its blocks flow
            if "content_block_delta" in line:
                break
        status, headers, err = busy.request("POST", MESSAGES, {**body, "stream": False})
        conn.close()
    assert status == 529
    assert err["error"]["type"] == "overloaded_error" and err["request_id"] == headers["request-id"]


# -- the server default budget on the real demo model --------------------------------------------


def test_default_thinking_budget_applies_to_every_protocol(tokenizer) -> None:
    budget = 8
    num_suffix = len(_control(tokenizer).suffix_ids)
    key = {"x-api-key": "local-secret"}
    # greedy: every exact token count below must not hang on a sampled EOS of the random model
    args = ("--default-thinking-budget", str(budget), "--api-key", "local-secret", "--greedy")
    with serve(*args) as real:
        sdk = anthropic.Anthropic(base_url=real.base_url, api_key="local-secret", max_retries=0)
        status, headers, err = real.request("POST", MESSAGES, {"model": "m", "messages": []})
        assert status == 401 and err["error"]["type"] == "authentication_error"
        assert err["request_id"] == headers["request-id"]
        msg = sdk.messages.create(model=MODEL_ID, max_tokens=40, messages=_ask("Say hello."))
        thinking = msg.content[0]
        assert thinking.type == "thinking" and thinking.thinking.endswith(GUIDANCE_TEXT)
        assert msg.usage.output_tokens == 40
        chat = {"model": MODEL_ID, "messages": _ask("Say hello."), "max_tokens": 40}
        status, _, out = real.request("POST", "/v1/chat/completions", chat, key)
        assert status == 200
        assert out["choices"][0]["message"]["reasoning_content"].endswith(GUIDANCE_TEXT)
        assert out["usage"]["completion_tokens"] == 40
        # the reasoning count includes the inserted guidance: it is reasoning output
        assert out["usage"]["completion_tokens_details"]["reasoning_tokens"] >= budget + num_suffix
        # non-thinking requests receive no cap
        off = sdk.messages.create(
            model=MODEL_ID,
            max_tokens=40,
            messages=_ask("Say hello."),
            thinking={"type": "disabled"},
        )
        assert all(GUIDANCE_TEXT not in getattr(b, "text", "") for b in off.content)
        # capacity: past the cap but short of the suffix plus one token is rejected up front
        for path, payload in (
            (MESSAGES, {"model": MODEL_ID, "messages": _ask("x")}),
            ("/v1/chat/completions", {"model": MODEL_ID, "messages": _ask("x")}),
        ):
            status, _, err = real.request(
                "POST", path, {**payload, "max_tokens": budget + num_suffix}, key
            )
            assert status == 400
            assert err["error"]["code"] == "thinking_budget_capacity_insufficient"
        ok = sdk.messages.create(model=MODEL_ID, max_tokens=budget, messages=_ask("x"))
        assert ok.stop_reason == "max_tokens" and GUIDANCE_TEXT not in ok.content[0].thinking
