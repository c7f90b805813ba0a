"""Prompt-cache markers located by the protocol layer: each explicit breakpoint becomes (message
index in the template messages, characters of that message's content before the boundary), for
Chat Completions parts, Responses parts (message and tool-result) and Anthropic cache_control
(system, user text, tool_result, the last tool, the request-level marker)."""

from __future__ import annotations

import pytest

from ninfer.protocol.anthropic import parse_messages_request
from ninfer.protocol.anthropic_messages import TOOLS_MARK
from ninfer.protocol.errors import ProtocolError
from ninfer.protocol.openai_chat import parse_chat_request
from ninfer.protocol.openai_responses_items import lower_items, normalize_input

BREAK = {"mode": "explicit"}
EPHEMERAL = {"type": "ephemeral"}


def _chat(**body):
    return parse_chat_request({"model": "m", **body})


def test_chat_breakpoints_and_mode() -> None:
    parts = [
        {"type": "text", "text": "abc", "prompt_cache_breakpoint": BREAK},
        {"type": "text", "text": "defg"},
        {"type": "text", "text": "hi", "prompt_cache_breakpoint": BREAK},
    ]
    req = _chat(
        messages=[
            {"role": "system", "content": "s"},
            {"role": "user", "content": parts},
            {"role": "assistant", "content": [
                {"type": "text", "text": "x", "prompt_cache_breakpoint": BREAK}]},
        ]
    )  # fmt: skip
    assert req.cache_marks == ((1, 3), (1, 9), (2, 1))
    assert req.messages[1]["content"] == "abcdefghi" and req.cache_implicit
    explicit = _chat(messages=[{"role": "user", "content": "q"}],
                     prompt_cache_options={"mode": "explicit"})  # fmt: skip
    assert not explicit.cache_implicit and explicit.cache_marks == ()
    for bad in ({"mode": "sometimes"}, "explicit"):
        with pytest.raises(ProtocolError) as e:
            _chat(messages=[{"role": "user", "content": "q"}], prompt_cache_options=bad)
        assert e.value.param.startswith("prompt_cache_options")
    with pytest.raises(ProtocolError) as e:
        bad_part = {"type": "text", "text": "a", "prompt_cache_breakpoint": {"mode": "implicit"}}
        _chat(messages=[{"role": "user", "content": [bad_part]}])
    assert e.value.param == "messages[0].content[0].prompt_cache_breakpoint"


def test_responses_breakpoints_in_messages_and_tool_results() -> None:
    items = normalize_input(
        [
            {"role": "user", "content": [
                {"type": "input_text", "text": "hello ", "prompt_cache_breakpoint": BREAK},
                {"type": "input_text", "text": "world"},
            ]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [
                {"type": "input_text", "text": "result", "prompt_cache_breakpoint": BREAK},
            ]},
            {"role": "user", "content": "next"},
        ]
    )  # fmt: skip
    marks: list[tuple[int, int]] = []
    messages = lower_items(items, lambda ns, name: name, marks=marks)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user"]
    assert marks == [(0, 6), (2, 6)]
    assert all("_parts" not in m for m in messages)


def test_anthropic_cache_control_positions() -> None:
    tool = {"name": "t", "input_schema": {"type": "object"}, "cache_control": EPHEMERAL}
    req = parse_messages_request(
        {
            "model": "m",
            "max_tokens": 8,
            "tools": [{"name": "a", "input_schema": {"type": "object"}}, tool],
            "system": [
                {"type": "text", "text": "sys one. "},
                {"type": "text", "text": "two", "cache_control": EPHEMERAL},
            ],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "q1", "cache_control": EPHEMERAL}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "u1", "name": "t", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "u1", "content": "ok"},
                    {"type": "text", "text": "more"},
                ]},
            ],
            "cache_control": EPHEMERAL,  # request level: the last cacheable block ("more")
        },
        default_max_tokens=8,
    )  # fmt: skip
    roles = [m["role"] for m in req.messages]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert req.cache_marks == ((TOOLS_MARK, None), (0, 12), (1, 2), (4, 4))
    marked_result = parse_messages_request(
        {
            "model": "m",
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "u1", "name": "t", "input": {},
                     "cache_control": EPHEMERAL}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "u1", "content": "ok",
                     "cache_control": EPHEMERAL}]},
            ],
        },
        default_max_tokens=8,
    )  # fmt: skip
    # a marker after a tool_use block is not a content position; one on a tool_result is its end
    assert marked_result.cache_marks == ((2, None),)


@pytest.mark.parametrize("system", ["Be brief.", [{"type": "text", "text": "Be brief."}]])
def test_anthropic_marks_after_a_system_prompt_name_the_message_they_are_on(system) -> None:
    """A string system prompt is a message of its own too: a marker on the first user message
    names message 1 (it named the system message, index 0, so it landed nowhere or in the system
    text), whichever form the system prompt takes."""
    req = parse_messages_request(
        {
            "model": "m",
            "max_tokens": 8,
            "system": system,
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "alpha beta", "cache_control": EPHEMERAL}]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "gamma"},
            ],
            "cache_control": EPHEMERAL,  # request level: the last cacheable block ("gamma")
        },
        default_max_tokens=8,
    )  # fmt: skip
    assert [m["role"] for m in req.messages] == ["system", "user", "assistant", "user"]
    assert req.cache_marks == ((1, 10), (3, 5))
    empty = parse_messages_request(
        {"model": "m", "max_tokens": 8, "system": "", "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "q", "cache_control": EPHEMERAL}]}]},
        default_max_tokens=8,
    )  # fmt: skip
    assert [m["role"] for m in empty.messages] == ["user"] and empty.cache_marks == ((0, 1),)
