"""Anthropic Messages request parsing: accepted shapes, template options, field-specific errors."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.protocol.anthropic import MessagesRequest, parse_messages_request
from ninfer.protocol.errors import ProtocolError

USER = [{"role": "user", "content": "hi"}]
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}


def _parse(count_only: bool = False, **body: Any) -> MessagesRequest:
    body.setdefault("model", "claude-local")
    body.setdefault("messages", USER)
    return parse_messages_request(body, default_max_tokens=4096, count_only=count_only)


def _error(**body: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        _parse(**body)
    return info.value


def test_minimal_request_uses_server_defaults() -> None:
    r = _parse()
    assert r.model == "claude-local"
    assert r.messages == [{"role": "user", "content": "hi"}]
    assert r.max_tokens == 4096 and not r.stream and not r.prefill
    assert r.render_kwargs(default_thinking=True, default_preserve=False) == {
        "enable_thinking": True
    }
    assert r.render_kwargs(default_thinking=False, default_preserve=True) == {
        "enable_thinking": False,
        "preserve_thinking": True,
    }


def test_sampling_stop_and_stream_enter_the_request() -> None:
    r = _parse(
        max_tokens=64,
        temperature=0.5,
        top_p=0.9,
        top_k=5,
        stop_sequences=["END", "###"],
        stream=True,
        metadata={"user_id": "u"},
        service_tier="auto",
        inference_geo="us",
        some_unknown_field=1,
    )
    assert r.max_tokens == 64 and r.stream
    assert r.sampling == {"temperature": 0.5, "top_p": 0.9, "top_k": 5}
    assert r.stop == ("END", "###")
    keep_all = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    assert _parse(context_management=keep_all).stop == ()  # a no-op edit is accepted


@pytest.mark.parametrize(
    ("thinking", "default", "enabled", "budget"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, False, True, 1024),
        ({"type": "adaptive"}, False, True, None),
        ({"type": "disabled"}, True, False, None),
        (None, True, True, None),
        (None, False, False, None),
    ],
)
def test_thinking_modes(thinking, default, enabled, budget) -> None:
    body = {"max_tokens": 2000}
    if thinking is not None:
        body["thinking"] = thinking
    r = _parse(**body)
    assert r.enable_thinking(default) is enabled
    assert r.budget_tokens == budget


def test_count_only_ignores_output_fields() -> None:
    r = _parse(count_only=True, max_tokens=0, stream="not-a-bool", top_k=999)
    assert r.sampling == {} and not r.stream
    # a budget is still validated for its own range, but not against max_tokens
    r = _parse(count_only=True, thinking={"type": "enabled", "budget_tokens": 5000})
    assert r.enable_thinking(False)


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"model": ""}, "model", "invalid_type"),
        ({"model": None}, "model", "missing_required_parameter"),
        ({"max_tokens": 0}, "max_tokens", "unsupported_value"),
        ({"max_tokens": -1}, "max_tokens", "invalid_value"),
        ({"max_tokens": 2.5}, "max_tokens", "invalid_value"),
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens", "missing_required_parameter"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1023}}, "thinking.budget_tokens", None),
        (
            {"max_tokens": 1024, "thinking": {"type": "enabled", "budget_tokens": 1024}},
            "thinking.budget_tokens",
            None,
        ),
        ({"thinking": {"type": "adaptive", "display": "omitted"}}, "thinking.display", None),
        ({"thinking": {"type": "sometimes"}}, "thinking.type", None),
        ({"temperature": 1.5}, "temperature", None),
        ({"top_k": 21}, "top_k", None),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences", None),
        ({"stop_sequences": [""]}, "stop_sequences", None),
        ({"stop_sequences": "END"}, "stop_sequences", "invalid_type"),
        ({"tools": [{**TOOL, "strict": True}]}, "tools[0].strict", None),
        ({"tools": [{**TOOL, "defer_loading": True}]}, "tools[0].defer_loading", None),
        (
            {"tools": [{**TOOL, "allowed_callers": ["code_execution"]}]},
            "tools[0].allowed_callers",
            None,
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type", None),
        ({"tools": [{"name": "x"}]}, "tools[0].input_schema", "missing_required_parameter"),
        (
            {"tools": [{"name": "x", "input_schema": {"type": "array"}}]},
            "tools[0].input_schema.type",
            None,
        ),
        (
            {"tools": [{"name": "bad name", "input_schema": {"type": "object"}}]},
            "tools[0].name",
            None,
        ),
        ({"tools": [TOOL, TOOL]}, "tools[1].name", None),
        ({"tools": [TOOL], "tool_choice": {"type": "any"}}, "tool_choice.type", None),
        (
            {"tools": [TOOL], "tool_choice": {"type": "tool", "name": "get_weather"}},
            "tool_choice.type",
            None,
        ),
        (
            {"tools": [TOOL], "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
            "tool_choice.disable_parallel_tool_use",
            None,
        ),
        ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "m"}]}, "mcp_servers", None),
        ({"container": "c1"}, "container", None),
        (
            {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
            "context_management.edits[0]",
            None,
        ),
        ({"output_format": {"type": "json_schema", "schema": {}}}, "output_format", None),
        ({"output_config": {"format": {"type": "json_schema"}}}, "output_config.format", None),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort", None),
        (
            {"chat_template_kwargs": {"add_generation_prompt": False}},
            "chat_template_kwargs.add_generation_prompt",
            None,
        ),
        (
            {"thinking": {"type": "disabled"}, "chat_template_kwargs": {"enable_thinking": True}},
            "chat_template_kwargs",
            "conflicting_template_option",
        ),
        (
            {
                "output_config": {"effort": "low"},
                "chat_template_kwargs": {"reasoning_effort": "high"},
            },
            "chat_template_kwargs",
            "conflicting_template_option",
        ),
        ({"preserve_thinking": "yes"}, "preserve_thinking", "invalid_type"),
    ],
)
def test_rejections_name_the_field(body, param, code) -> None:
    err = _error(**body)
    assert err.status == 400
    assert err.param == param
    assert err.message.startswith(param) or param == "chat_template_kwargs"
    if code is not None:
        assert err.code == code


def test_tools_are_lowered_to_function_tools_in_order() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}, "days": {}}}
    tool = {
        "name": "get_weather",
        "description": "Weather",
        "input_schema": schema,
        "input_examples": [{"city": "Paris"}],
        "cache_control": {"type": "ephemeral"},
    }
    r = _parse(tools=[tool, {**TOOL, "name": "other", "type": "custom"}])
    assert r.tools is not None
    first = r.tools[0]["function"]
    assert r.tools[0]["type"] == "function"
    assert list(first) == ["name", "description", "parameters", "input_examples"]
    assert first["parameters"] is schema
    assert r.tools[1]["function"]["name"] == "other"
    assert _parse(tools=[TOOL], tool_choice={"type": "none"}).tools is None
    assert _parse(tools=[TOOL], tool_choice={"type": "auto"}).tools is not None


def test_effort_and_template_kwargs_reach_the_template() -> None:
    r = _parse(output_config={"effort": "high"}, chat_template_kwargs={"custom": 1})
    kwargs = r.render_kwargs(default_thinking=True, default_preserve=False)
    assert kwargs == {"custom": 1, "enable_thinking": True, "reasoning_effort": "high"}
    r = _parse(chat_template_kwargs={"enable_thinking": False})
    assert not r.enable_thinking(True)  # kwargs may choose the mode when thinking is absent


def test_prefill_turns_thinking_off_and_keeps_the_turn_open() -> None:
    messages = [*USER, {"role": "assistant", "content": "The answer is"}]
    r = _parse(messages=messages)
    assert r.prefill and not r.enable_thinking(True)
    kwargs = r.render_kwargs(default_thinking=True, default_preserve=False)
    assert kwargs["add_generation_prompt"] is False
    for thinking in ({"type": "adaptive"}, {"type": "enabled", "budget_tokens": 1024}):
        err = _error(messages=messages, thinking=thinking, max_tokens=2048)
        assert (err.param, err.code) == ("thinking", "invalid_prefill")
