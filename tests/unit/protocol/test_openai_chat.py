"""Chat Completions parsing: table-driven JSON -> ChatCompletionRequest / field-specific errors."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.protocol.errors import ProtocolError
from ninfer.protocol.openai_chat import parse_chat_request

USER = {"role": "user", "content": "hi"}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [USER], **fields}


# -- accepted requests --------------------------------------------------------------------------


def test_minimal_request_defaults() -> None:
    req = parse_chat_request(body())
    assert req.model == "m"
    assert req.messages == [{"role": "user", "content": "hi"}]
    assert req.tools is None and req.stop == () and req.sampling == {}
    assert req.max_tokens is None and not req.stream and not req.include_usage


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"temperature": 0}, {"temperature": 0.0}),
        ({"top_p": 0.5, "top_k": 20, "min_p": 1}, {"top_p": 0.5, "top_k": 20, "min_p": 1.0}),
        (
            {"presence_penalty": -2, "frequency_penalty": 2},
            {"presence_penalty": -2.0, "frequency_penalty": 2.0},
        ),
        ({"seed": -(1 << 63)}, {"seed": -(1 << 63)}),
        ({"temperature": None, "seed": None}, {}),
    ],
    ids=["temp0", "top", "penalties", "negative-seed", "nulls"],
)
def test_sampling_fields(fields: dict, expected: dict) -> None:
    assert parse_chat_request(body(**fields)).sampling == expected


@pytest.mark.parametrize(
    ("fields", "max_tokens"),
    [
        ({"max_tokens": 0}, 0),
        ({"max_completion_tokens": 7}, 7),
        ({"max_tokens": 5, "max_completion_tokens": 5}, 5),
        ({}, None),
    ],
)
def test_max_tokens_spellings(fields: dict, max_tokens: int | None) -> None:
    assert parse_chat_request(body(**fields)).max_tokens == max_tokens


def test_stop_string_or_list() -> None:
    assert parse_chat_request(body(stop="x")).stop == ("x",)
    assert parse_chat_request(body(stop=["a", "b", "c", "d"])).stop == ("a", "b", "c", "d")


def test_neutral_fields_are_accepted() -> None:
    req = parse_chat_request(
        body(
            n=1,
            logit_bias={"42": 0},
            logprobs=False,
            top_logprobs=0,
            verbosity="medium",
            response_format={"type": "text"},
            modalities=["text"],
            repetition_penalty=1,
            mm_processor_kwargs={"x": None},
            prediction={"type": "content", "content": "x"},
            metadata={"a": "b"},
            user="u",
            service_tier="auto",
            prompt_cache_key="k",
            functions=[],
            some_unknown_field={"ignored": True},
        )
    )
    assert req.messages == [{"role": "user", "content": "hi"}]


def test_message_roles_and_parts_normalise_for_the_template() -> None:
    req = parse_chat_request(
        body(
            messages=[
                {
                    "role": "developer",
                    "content": [
                        {"type": "text", "text": "Be "},
                        {"type": "text", "text": "brief."},
                    ],
                },
                {"role": "user", "content": ""},
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "b"}],
                    "reasoning": "thought",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"z": 1, "a": 2}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"},
                {
                    "role": "assistant",
                    "content": None,
                    "function_call": {"name": "g", "arguments": "{}"},
                },
                {"role": "function", "name": "g", "content": "ok"},
            ]
        )
    )
    assert req.messages == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": ""},
        {
            "role": "assistant",
            "content": "ab",
            "reasoning_content": "thought",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"z": 1, "a": 2}'},
                }
            ],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "g", "arguments": "{}"}}],
        },
        {"role": "tool", "content": "ok"},
    ]


def test_tools_and_tool_choice() -> None:
    other = {"type": "function", "function": {"name": "other"}}
    assert parse_chat_request(body(tools=[TOOL])).tools == [TOOL]
    assert parse_chat_request(body(tools=[TOOL], tool_choice="auto")).tools == [TOOL]
    assert parse_chat_request(body(tools=[TOOL], tool_choice="none")).tools is None
    allowed = {
        "type": "allowed_tools",
        "allowed_tools": {
            "mode": "auto",
            "tools": [{"type": "function", "function": {"name": "other"}}],
        },
    }
    assert parse_chat_request(body(tools=[TOOL, other], tool_choice=allowed)).tools == [other]
    # parallel_tool_calls false is fine when no tool is callable
    assert parse_chat_request(body(parallel_tool_calls=False)).tools is None


@pytest.mark.parametrize(
    ("fields", "defaults", "thinking", "kwargs"),
    [
        ({}, (True, False), True, {}),
        ({}, (False, True), False, {"preserve_thinking": True}),
        ({"enable_thinking": True}, (False, False), True, {}),
        ({"reasoning_effort": "none"}, (True, False), False, {"reasoning_effort": "none"}),
        ({"reasoning_effort": "high"}, (False, False), True, {"reasoning_effort": "high"}),
        (
            {"chat_template_kwargs": {"enable_thinking": False, "custom": None}},
            (True, False),
            False,
            {"custom": None},
        ),
        ({"chat_template_kwargs": {"enable_thinking": None}}, (False, False), False, {}),
        ({"preserve_thinking": False}, (True, True), True, {}),
        (
            {"enable_thinking": True, "chat_template_kwargs": {"enable_thinking": True}},
            (False, False),
            True,
            {},
        ),
    ],
    ids=[
        "defaults",
        "server-off",
        "request-on",
        "effort-none",
        "effort-high",
        "kwargs",
        "kwargs-null",
        "preserve-off",
        "agreeing-duplicate",
    ],
)
def test_template_options(
    fields: dict, defaults: tuple[bool, bool], thinking: bool, kwargs: dict
) -> None:
    req = parse_chat_request(body(**fields))
    opts = req.template_options(default_thinking=defaults[0], default_preserve=defaults[1])
    assert opts.enable_thinking is thinking
    assert opts.kwargs == kwargs


# -- rejected requests --------------------------------------------------------------------------

REJECTIONS: list[tuple[str, Any, str, str | None]] = [
    # (id, body, param, code)
    ("not-object", [1], "body", "invalid_type"),
    ("no-model", {"messages": [USER]}, "model", "missing_required_parameter"),
    ("model-type", {"model": 3, "messages": [USER]}, "model", "invalid_type"),
    ("no-messages", {"model": "m"}, "messages", "missing_required_parameter"),
    ("empty-messages", body(messages=[]), "messages", "invalid_value"),
    ("bad-role", body(messages=[{"role": "robot", "content": "x"}]), "messages[0].role", None),
    (
        "user-name",
        body(messages=[{"role": "user", "name": "bob", "content": "x"}]),
        "messages[0].name",
        "unsupported_parameter",
    ),
    (
        "tool-name-type",
        body(messages=[{"role": "tool", "name": 3, "content": "x"}]),
        "messages[0].name",
        "invalid_type",
    ),
    (
        "content-type",
        body(messages=[{"role": "user", "content": 3}]),
        "messages[0].content",
        "invalid_type",
    ),
    (
        "image-detail-high",
        body(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:,", "detail": "high"}}
                    ],
                }
            ]
        ),
        "messages[0].content[0].image_url.detail",
        "unsupported_parameter",
    ),
    (
        "image-file-url",
        body(
            messages=[
                {"role": "user", "content": [{"type": "image_url", "image_url": "file:///etc"}]}
            ]
        ),
        "messages[0].content[0].image_url",
        "invalid_media",
    ),
    (
        "image-in-system",
        body(
            messages=[
                {"role": "system", "content": [{"type": "image_url", "image_url": "http://x/a"}]}
            ]
        ),
        "messages[0].content[0]",
        "unsupported_parameter",
    ),
    (
        "audio-part",
        body(messages=[{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]),
        "messages[0].content[0]",
        "unsupported_parameter",
    ),
    (
        "user-refusal",
        body(messages=[{"role": "user", "content": [{"type": "refusal", "refusal": "x"}]}]),
        "messages[0].content[0]",
        "unsupported_parameter",
    ),
    (
        "bad-arguments",
        body(
            messages=[
                {
                    "role": "assistant",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "f", "arguments": "[1]"}}
                    ],
                }
            ]
        ),
        "messages[0].tool_calls[0].function.arguments",
        None,
    ),
    ("n2", body(n=2), "n", "unsupported_value"),
    ("temp", body(temperature=2.5), "temperature", "invalid_value"),
    ("temp-bool", body(temperature=True), "temperature", "invalid_value"),
    ("top_k", body(top_k=21), "top_k", "invalid_value"),
    ("top_k-float", body(top_k=2.0), "top_k", "invalid_value"),
    ("min_p", body(min_p=-0.1), "min_p", "invalid_value"),
    ("seed", body(seed=1 << 63), "seed", "invalid_value"),
    ("max_tokens", body(max_tokens=-1), "max_tokens", "invalid_value"),
    ("max-disagree", body(max_tokens=1, max_completion_tokens=2), "max_tokens", None),
    ("stop5", body(stop=["a", "b", "c", "d", "e"]), "stop", "invalid_value"),
    ("stop-empty", body(stop=[""]), "stop", "invalid_value"),
    ("stop-type", body(stop=[1]), "stop", "invalid_type"),
    ("json-mode", body(response_format={"type": "json_object"}), "response_format", None),
    ("guided", body(guided_json={"type": "object"}), "guided_json", None),
    ("logit-bias", body(logit_bias={"1": 5}), "logit_bias", None),
    ("logprobs", body(logprobs=True), "logprobs", None),
    ("top-logprobs", body(top_logprobs=2), "top_logprobs", None),
    ("audio-out", body(modalities=["text", "audio"]), "modalities", None),
    ("verbosity", body(verbosity="high"), "verbosity", None),
    ("store", body(store=True), "store", None),
    ("web-search", body(web_search_options={}), "web_search_options", None),
    ("repetition", body(repetition_penalty=1.1), "repetition_penalty", None),
    ("min-tokens", body(min_tokens=8), "min_tokens", None),
    ("best-of", body(best_of=3), "best_of", None),
    ("beam-search", body(use_beam_search=True), "use_beam_search", None),
    ("stop-in-output", body(include_stop_str_in_output=True), "include_stop_str_in_output", None),
    ("functions", body(functions=[{"name": "f"}]), "functions", None),
    (
        "strict",
        body(tools=[{**TOOL, "function": {**TOOL["function"], "strict": True}}]),
        "tools[0].function.strict",
        None,
    ),
    ("hosted-tool", body(tools=[{"type": "web_search"}]), "tools[0].type", None),
    ("required", body(tools=[TOOL], tool_choice="required"), "tool_choice", None),
    (
        "named",
        body(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}}),
        "tool_choice",
        None,
    ),
    ("parallel-false", body(tools=[TOOL], parallel_tool_calls=False), "parallel_tool_calls", None),
    ("stream-options", body(stream_options={"include_usage": True}), "stream_options", None),
    ("effort", body(reasoning_effort="extreme"), "reasoning_effort", None),
    ("thinking-type", body(enable_thinking="yes"), "enable_thinking", "invalid_type"),
    (
        "kwargs-reserved",
        body(chat_template_kwargs={"add_generation_prompt": False}),
        "chat_template_kwargs.add_generation_prompt",
        None,
    ),
    (
        "kwargs-messages",
        body(chat_template_kwargs={"messages": []}),
        "chat_template_kwargs.messages",
        None,
    ),
    (
        "conflict-top-kwargs",
        body(enable_thinking=True, chat_template_kwargs={"enable_thinking": False}),
        "chat_template_kwargs",
        "conflicting_template_option",
    ),
    (
        "conflict-effort",
        body(enable_thinking=True, reasoning_effort="none"),
        "chat_template_kwargs",
        "conflicting_template_option",
    ),
    (
        "conflict-effort-off",
        body(chat_template_kwargs={"enable_thinking": False}, reasoning_effort="low"),
        "chat_template_kwargs",
        "conflicting_template_option",
    ),
    (
        "conflict-preserve",
        body(preserve_thinking=True, chat_template_kwargs={"preserve_thinking": False}),
        "chat_template_kwargs",
        "conflicting_template_option",
    ),
]


@pytest.mark.parametrize(
    ("payload", "param", "code"), [r[1:] for r in REJECTIONS], ids=[r[0] for r in REJECTIONS]
)
def test_rejections_name_the_field(payload: Any, param: str, code: str | None) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_chat_request(payload)
    err = info.value
    assert err.status == 400
    assert err.param == param
    if code is not None:
        assert err.code == code
    assert "\n" not in err.message and err.message
    assert err.body() == {
        "error": {
            "message": err.message,
            "type": "invalid_request_error",
            "param": param,
            "code": err.code,
        }
    }


def _TEXT(text: str) -> dict[str, str]:  # noqa: N802
    return {"type": "text", "text": text}


_CALL = {"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}


def test_media_parts_become_template_parts_in_order() -> None:
    chat = parse_chat_request(
        body(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a"},
                        {"type": "image_url", "image_url": {"url": "https://e.x/i.png"}},
                        {"type": "video_url", "video_url": "data:video/mp4;base64,AAAA"},
                        {"type": "image_url", "image_url": {"url": "data:,", "detail": "auto"}},
                        {"type": "text", "text": "b"},
                    ],
                },
                {"role": "assistant", "content": "", "tool_calls": [_CALL]},
                {
                    "role": "tool",
                    "tool_call_id": "c1",
                    "content": [{"type": "image_url", "image_url": {"url": "https://e.x/s.png"}}],
                },
            ]
        )
    )
    assert chat.messages[0]["content"] == [
        {"type": "text", "text": "a"},
        {
            "type": "image",
            "image": "https://e.x/i.png",
            "source_param": "messages[0].content[1].image_url",
        },
        {
            "type": "video",
            "video": "data:video/mp4;base64,AAAA",
            "source_param": "messages[0].content[2].video_url",
        },
        {"type": "image", "image": "data:,", "source_param": "messages[0].content[3].image_url"},
        {"type": "text", "text": "b"},
    ]
    assert chat.messages[2]["content"] == [
        {
            "type": "image",
            "image": "https://e.x/s.png",
            "source_param": "messages[2].content[0].image_url",
        }
    ]
    # text-only part lists still join into one string
    plain = parse_chat_request(
        body(messages=[{"role": "user", "content": [_TEXT("x"), _TEXT("y")]}])
    )
    assert plain.messages[0]["content"] == "xy"


def test_vllm_neutral_extras_pass_and_ignore_eos_is_carried() -> None:
    neutral = body(min_tokens=0, best_of=1, use_beam_search=False, include_stop_str_in_output=False)
    assert parse_chat_request(neutral).ignore_eos is False
    assert parse_chat_request(body(ignore_eos=True)).ignore_eos is True
    with pytest.raises(ProtocolError) as e:
        parse_chat_request(body(ignore_eos="yes"))
    assert e.value.param == "ignore_eos"
