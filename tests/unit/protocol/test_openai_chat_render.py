"""Chat Completions rendering: aggregate body and stream chunk shapes."""

from __future__ import annotations

import json

import pytest

from ninfer.chat.output_decoder import ToolCall
from ninfer.protocol.openai_chat_render import ChatRenderer, CompletionUsage, finish_reason


@pytest.mark.parametrize(
    ("engine", "tools", "expected"),
    [
        ("stop", False, "stop"),
        ("stop", True, "tool_calls"),
        ("length", False, "length"),
        ("context", True, "length"),
    ],
)
def test_finish_reason(engine: str, tools: bool, expected: str) -> None:
    assert finish_reason(engine, tools) == expected


def test_usage_dict() -> None:
    assert CompletionUsage(10, 4, cached_tokens=3, reasoning_tokens=2).to_dict() == {
        "prompt_tokens": 10,
        "completion_tokens": 4,
        "total_tokens": 14,
        "prompt_tokens_details": {"cached_tokens": 3},
        "completion_tokens_details": {"reasoning_tokens": 2},
    }


def test_completion_body() -> None:
    r = ChatRenderer("chatcmpl-1", "m", 123)
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    out = r.completion(
        content="",
        reasoning="why",
        tool_calls=[call],
        finish="tool_calls",
        usage=CompletionUsage(1, 2),
        timings={"cache_n": 0},
    )
    assert out["object"] == "chat.completion" and out["id"] == "chatcmpl-1"
    choice = out["choices"][0]
    assert choice["logprobs"] is None and choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": None,
        "refusal": None,
        "reasoning_content": "why",
        "tool_calls": [call],
    }
    assert out["timings"] == {"cache_n": 0} and out["usage"]["total_tokens"] == 3
    plain = r.completion(
        content="",
        reasoning="",
        tool_calls=[],
        finish="stop",
        usage=CompletionUsage(1, 0),
        timings={},
    )
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": "", "refusal": None}
    json.dumps(out)  # wire-serialisable


def test_stream_chunks() -> None:
    r = ChatRenderer("chatcmpl-1", "m", 123, include_usage=True)
    role = r.role_chunk()
    assert role["object"] == "chat.completion.chunk" and role["usage"] is None
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert r.text_chunk("reasoning", "a")["choices"][0]["delta"] == {"reasoning_content": "a"}
    assert r.text_chunk("content", "b", {"x": 1})["timings"] == {"x": 1}
    tool = r.tool_call_chunk(ToolCall(index=1, name="f", arguments='{"a": 1}'), "call_9")
    assert tool["choices"][0]["delta"] == {
        "tool_calls": [
            {
                "index": 1,
                "id": "call_9",
                "type": "function",
                "function": {"name": "f", "arguments": '{"a": 1}'},
            }
        ]
    }
    finish = r.finish_chunk("stop")
    assert finish["choices"][0]["finish_reason"] == "stop" and "timings" not in finish
    usage = r.usage_chunk(CompletionUsage(2, 1), {"t": 1})
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 3
    assert usage["timings"] == {"t": 1}
    no_usage = ChatRenderer("c", "m", 1).role_chunk()
    assert "usage" not in no_usage
