"""Anthropic rendering: the SSE block lifecycle, aggregate blocks, stop reasons and error bodies."""

from __future__ import annotations

import json

import pytest

from ninfer.chat.output_decoder import ToolCall
from ninfer.protocol.anthropic_render import (
    BlockAssembler,
    MessageRenderer,
    MessageUsage,
    error_body,
    stop_reason,
    thinking_signature,
)
from ninfer.protocol.errors import ProtocolError


def _names(events) -> list[str]:
    return [name for name, _ in events]


def test_block_lifecycle_for_thinking_text_and_tool_use() -> None:
    blocks = BlockAssembler()
    events = blocks.thinking("Let me ") + blocks.thinking("think.") + blocks.text("")
    events += blocks.text("Calling.") + blocks.tool_use(
        ToolCall(0, "get_weather", '{"city": "Paris", "days": 3}')
    )
    events += blocks.close()
    assert _names(events) == [
        "content_block_start",  # thinking
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",  # signature_delta before the thinking block closes
        "content_block_stop",
        "content_block_start",  # text
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # tool_use
        "content_block_delta",
        "content_block_stop",
    ]
    data = [d for _, d in events]
    assert all(d["type"] == name for name, d in events)
    assert [d["index"] for d in data] == [0, 0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert data[0]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert data[1]["delta"] == {"type": "thinking_delta", "thinking": "Let me "}
    signature = thinking_signature("Let me think.")
    assert data[3]["delta"] == {"type": "signature_delta", "signature": signature}
    assert data[5]["content_block"] == {"type": "text", "text": ""}
    assert data[6]["delta"] == {"type": "text_delta", "text": "Calling."}
    start = data[8]["content_block"]
    assert start["type"] == "tool_use" and start["input"] == {} and start["name"] == "get_weather"
    assert start["id"].startswith("toolu_")
    assert data[9]["delta"] == {
        "type": "input_json_delta",
        "partial_json": '{"city": "Paris", "days": 3}',
    }
    # the aggregate holds the same blocks, the tool input parsed in model order
    assert blocks.blocks == [
        {"type": "thinking", "thinking": "Let me think.", "signature": signature},
        {"type": "text", "text": "Calling."},
        {
            "type": "tool_use",
            "id": start["id"],
            "name": "get_weather",
            "input": {"city": "Paris", "days": 3},
        },
    ]
    assert list(blocks.blocks[2]["input"]) == ["city", "days"]
    assert blocks.has_tool_use


def test_streamed_deltas_concatenate_to_the_aggregate_text() -> None:
    blocks = BlockAssembler()
    pieces = ["a", "b", "c"]
    events = [e for p in pieces for e in blocks.text(p)] + blocks.close()
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert text == blocks.blocks[0]["text"] == "abc"
    assert blocks.close() == []  # closing twice emits nothing


def test_tool_use_without_arguments_sends_no_delta() -> None:
    events = BlockAssembler().tool_use(ToolCall(0, "ping", ""))
    assert _names(events) == ["content_block_start", "content_block_stop"]


def test_signature_is_deterministic_and_text_bound() -> None:
    assert thinking_signature("x") == thinking_signature("x") != thinking_signature("y")


@pytest.mark.parametrize(
    ("finish", "stop_seq", "tools", "expected"),
    [
        ("stop", None, False, "end_turn"),
        ("stop", None, True, "tool_use"),
        ("stop", "END", False, "stop_sequence"),
        ("length", None, True, "max_tokens"),
        ("context", None, False, "model_context_window_exceeded"),
    ],
)
def test_stop_reason(finish, stop_seq, tools, expected) -> None:
    assert stop_reason(finish, stop_sequence=stop_seq, has_tool_use=tools) == expected


def test_message_start_delta_and_body_shapes() -> None:
    r = MessageRenderer("msg_1", "claude-local")
    usage = MessageUsage(input_tokens=7, output_tokens=3, cache_read_input_tokens=2)
    name, start = r.start(MessageUsage(9, 0))
    assert name == "message_start"
    assert start["message"]["content"] == [] and start["message"]["stop_reason"] is None
    assert start["message"]["usage"]["input_tokens"] == 9
    name, delta = r.delta("stop_sequence", "END", usage)
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert delta["usage"] == {
        "input_tokens": 7,
        "cache_creation_input_tokens": None,
        "cache_read_input_tokens": 2,
        "output_tokens": 3,
    }
    body = r.message([], stop_reason="end_turn", stop_sequence=None, usage=usage)
    assert (body["type"], body["role"], body["model"]) == ("message", "assistant", "claude-local")
    assert r.ping() == ("ping", {"type": "ping"}) and r.stop() == (
        "message_stop",
        {"type": "message_stop"},
    )
    json.dumps(body)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (500, "api_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
def test_error_body_uses_anthropic_categories(status, kind) -> None:
    err = ProtocolError("max_tokens: bad", status=status, code="c", param="max_tokens")
    body = error_body(err, "req-1")
    assert body == {
        "type": "error",
        "error": {"type": kind, "message": "max_tokens: bad", "code": "c", "param": "max_tokens"},
        "request_id": "req-1",
    }
