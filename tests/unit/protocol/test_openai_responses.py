"""Responses Create / input_tokens parsing: each field accepted or rejected by name."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.protocol.errors import ProtocolError
from ninfer.protocol.openai_responses import (
    engine_tool_name,
    parse_input_tokens_request,
    parse_responses_request,
)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": False,
}
MCP = {
    "type": "namespace",
    "name": "mcp__weather",
    "description": "Weather service",
    "tools": [{"type": "function", "name": "get_current"}, {"type": "function", "name": "x"}],
}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hi", **fields}


def rejects(fields: dict[str, Any], param: str | None, code: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_responses_request(fields)
    assert info.value.param == param, info.value
    assert info.value.code == code, info.value
    assert info.value.status == 400
    return info.value


def test_minimal_request_defaults() -> None:
    req = parse_responses_request(body())
    assert req.model == "m" and req.store is True and req.stream is False
    assert req.max_output_tokens is None and req.parallel_tool_calls is True
    assert req.tools.template_tools is None and req.tool_choice == "auto"
    (item,) = req.input_items
    assert item["role"] == "user" and item["content"] == [{"type": "input_text", "text": "hi"}]
    assert item["id"].startswith("msg_")


def test_every_table_field_is_accepted_at_a_supported_value() -> None:
    req = parse_responses_request(
        body(
            instructions="be brief",
            previous_response_id="resp_1",
            max_output_tokens=0,
            stream=True,
            store=False,
            temperature=2,
            top_p=0,
            metadata={"k" * 64: "v" * 512},
            client_metadata={"trace": 1},
            reasoning={"effort": "high", "summary": "auto"},
            chat_template_kwargs={"custom": 1},
            preserve_thinking=True,
            text={"format": {"type": "text"}, "verbosity": "medium"},
            tools=[WEATHER, MCP],
            tool_choice="auto",
            parallel_tool_calls=True,
            max_tool_calls=3,
            truncation="disabled",
            top_logprobs=0,
            service_tier="auto",
            background=False,
            include=[],
            stream_options={"include_obfuscation": False},
            prompt_cache_key="k",
            prompt_cache_options={"mode": "explicit"},
            prompt_cache_retention="24h",
            safety_identifier="s",
            user="u",
        )
    )
    assert req.stream and not req.store and req.max_output_tokens == 0
    assert req.sampling == {"temperature": 2.0, "top_p": 0.0}
    assert req.reasoning_effort == "high" and req.preserve_thinking is True
    assert req.template_kwargs == {"custom": 1}
    assert req.max_tool_calls == 3 and req.echo["prompt_cache_key"] == "k"


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"seed": 1}, "seed", "unknown_parameter"),
        ({"stop": ["x"]}, "stop", "unknown_parameter"),
        ({"conversation": "c"}, "conversation", "unsupported_parameter"),
        ({"prompt": {"id": "p"}}, "prompt", "unsupported_parameter"),
        ({"context_management": []}, "context_management", "unsupported_parameter"),
        ({"temperature": 2.5}, "temperature", "invalid_value"),
        ({"top_p": float("nan")}, "top_p", "invalid_value"),
        ({"max_output_tokens": -1}, "max_output_tokens", "invalid_value"),
        ({"max_output_tokens": True}, "max_output_tokens", "invalid_value"),
        ({"stream": "yes"}, "stream", "invalid_type"),
        ({"store": 1}, "store", "invalid_type"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "invalid_value"),
        ({"metadata": {"k" * 65: "v"}}, "metadata." + "k" * 65, "invalid_value"),
        ({"metadata": {"k": "v" * 513}}, "metadata.k", "invalid_value"),
        ({"metadata": {"k": 1}}, "metadata.k", "invalid_type"),
        ({"client_metadata": "x"}, "client_metadata", "invalid_type"),
        ({"reasoning": {"effort": "huge"}}, "reasoning.effort", "invalid_value"),
        ({"reasoning": {"summary": "detailed"}}, "reasoning.summary", "unsupported_parameter"),
        ({"text": {"format": {"type": "json_object"}}}, "text.format", "unsupported_parameter"),
        ({"text": {"verbosity": "loud"}}, "text.verbosity", "invalid_value"),
        ({"truncation": "auto"}, "truncation", "unsupported_parameter"),
        ({"top_logprobs": 2}, "top_logprobs", "unsupported_parameter"),
        ({"service_tier": "flex"}, "service_tier", "unsupported_parameter"),
        ({"background": True}, "background", "unsupported_parameter"),
        ({"include": ["message.output_text.logprobs"]}, "include[0]", "unsupported_parameter"),
        ({"include": ["reasoning.everything"]}, "include[0]", "invalid_value"),
        ({"include": "reasoning.encrypted_content"}, "include", "invalid_type"),
        ({"stream_options": {"include_obfuscation": True}}, "stream_options", "invalid_value"),
        (
            {"stream": True, "stream_options": {"include_usage": True}},
            "stream_options.include_usage",
            "unknown_parameter",
        ),
        ({"max_tool_calls": -2}, "max_tool_calls", "invalid_value"),
        ({"prompt_cache_retention": "forever"}, "prompt_cache_retention", "invalid_value"),
        ({"prompt_cache_options": {"mode": "x"}}, "prompt_cache_options.mode", "invalid_value"),
        ({"user": 5}, "user", "invalid_type"),
        ({"previous_response_id": ""}, "previous_response_id", "invalid_type"),
        ({"instructions": ["x"]}, "instructions", "invalid_type"),
        (
            {"preserve_thinking": True, "chat_template_kwargs": {"preserve_thinking": False}},
            "chat_template_kwargs",
            "conflicting_template_option",
        ),
        (
            {"reasoning": {"effort": "none"}, "chat_template_kwargs": {"enable_thinking": True}},
            "chat_template_kwargs",
            "conflicting_template_option",
        ),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages", None),
    ],
)
def test_rejections_name_the_field(fields: dict[str, Any], param: str, code: str | None) -> None:
    rejects(body(**fields), param, code or "invalid_value")


def test_model_is_required_for_create_but_optional_for_counting() -> None:
    rejects({"input": "hi"}, "model", "missing_required_parameter")
    rejects({"model": "", "input": "hi"}, "model", "invalid_type")
    assert parse_input_tokens_request({"input": "hi"}).model is None


def test_input_tokens_accepts_prompt_fields_and_rejects_generation_fields() -> None:
    req = parse_input_tokens_request(
        {
            "model": "m",
            "input": "hi",
            "instructions": "x",
            "reasoning": {"effort": "none"},
            "tools": [WEATHER],
            "tool_choice": "none",
            "text": {"format": {"type": "text"}},
            "truncation": "disabled",
            "preserve_thinking": False,
        }
    )
    assert req.reasoning_effort == "none" and req.tools.template_tools is None
    with pytest.raises(ProtocolError) as info:
        parse_input_tokens_request({"input": "hi", "max_output_tokens": 5})
    assert info.value.code == "unknown_parameter" and info.value.param == "max_output_tokens"


def test_template_options_resolve_effort_and_preserve() -> None:
    req = parse_responses_request(body(reasoning={"effort": "none"}))
    opts = req.template_options(default_thinking=True, preserve=True)
    assert opts.enable_thinking is False
    assert opts.kwargs == {"preserve_thinking": True, "reasoning_effort": "none"}
    req = parse_responses_request(body(reasoning={"effort": "low"}))
    opts = req.template_options(default_thinking=False, preserve=False)
    assert opts.enable_thinking is True and opts.kwargs == {"reasoning_effort": "low"}
    opts = parse_responses_request(body()).template_options(default_thinking=False, preserve=False)
    assert opts.enable_thinking is False and opts.kwargs == {}


# -- tools --------------------------------------------------------------------------------------


def test_direct_and_namespaced_functions_get_distinct_engine_names() -> None:
    clash = {"type": "namespace", "name": "other", "tools": [{"type": "function", "name": "x"}]}
    req = parse_responses_request(body(tools=[WEATHER, MCP, clash]))
    names = [t["function"]["name"] for t in req.tools.template_tools]
    assert names == ["get_weather", "mcp__weather__get_current", "mcp__weather__x", "other__x"]
    assert req.tools.template_tools[0]["function"]["parameters"] == WEATHER["parameters"]
    assert req.tools.identity("mcp__weather__x") == ("mcp__weather", "x")
    assert req.tools.identity("other__x") == ("other", "x")
    assert req.tools.identity("get_weather") == (None, "get_weather")
    assert req.tools.declared == [WEATHER, MCP, clash]
    assert engine_tool_name("ns", "f") == "ns__f" and engine_tool_name(None, "f") == "f"


def test_duplicate_engine_identity_is_rejected() -> None:
    direct = {"type": "function", "name": "mcp__weather__x"}
    rejects(body(tools=[MCP, direct]), "tools", "duplicate_tool")


def test_allowed_tools_filters_in_declaration_order_and_none_disables() -> None:
    choice = {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [
            {"type": "function", "name": "x", "namespace": "mcp__weather"},
            {"type": "function", "name": "get_weather"},
        ],
    }
    req = parse_responses_request(body(tools=[WEATHER, MCP], tool_choice=choice))
    assert [t["function"]["name"] for t in req.tools.template_tools] == [
        "get_weather",
        "mcp__weather__x",
    ]
    assert req.tool_choice == choice
    none = parse_responses_request(body(tools=[WEATHER], tool_choice="none"))
    assert none.tools.template_tools is None
    # with no callable tool, parallel_tool_calls:false cannot be violated
    parse_responses_request(body(tools=[WEATHER], tool_choice="none", parallel_tool_calls=False))


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "computer_use_2099"}]}, "tools[0].type"),
        (
            {"tools": [{"type": "custom", "name": "x", "defer_loading": True}]},
            "tools[0].defer_loading",
        ),
        ({"tools": [{**WEATHER, "strict": True}]}, "tools[0].strict"),
        ({"tools": [{**WEATHER, "defer_loading": True}]}, "tools[0].defer_loading"),
        ({"tools": [{**WEATHER, "output_schema": {}}]}, "tools[0].output_schema"),
        ({"tools": [{**WEATHER, "allowed_callers": ["programmatic"]}]}, "tools[0].allowed_callers"),
        (
            {"tools": [{**MCP, "tools": [{"type": "custom", "name": "c"}]}]},
            "tools[0].tools[0].type",
        ),
        ({"tools": [WEATHER], "tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "x"}}, "tool_choice"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "mode": "required"}},
            "tool_choice.mode",
        ),
    ],
)
def test_unsupported_tool_features_are_rejected(fields: dict[str, Any], param: str) -> None:
    rejects(body(**fields), param, "unsupported_parameter")


def test_malformed_tools() -> None:
    rejects(body(tools=[{"type": "function"}]), "tools[0].name", "missing_required_parameter")
    rejects(body(tools=[{**WEATHER, "parameters": "x"}]), "tools[0].parameters", "invalid_type")
    rejects(body(tools={"a": 1}), "tools", "invalid_type")
    choice = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "z"}]}
    rejects(body(tools=[WEATHER], tool_choice=choice), "tool_choice", "invalid_value")
