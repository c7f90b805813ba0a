"""Golden prompts of the packaged qwen3_5.jinja, one per message shape.

Every case marked `official=SAME` was checked against the official Qwen3.5 chat template
(rendered in Hugging Face's chat-template environment) on 2026-12-02: it renders the identical
string. `official=PREFILL`: the official template renders the expected string plus the closing
"<|im_end|>\\n" (ours leaves a final assistant turn open). `official=None`: the official
template rejects the conversation or lacks the option; those goldens were derived from an
accepted equivalent (developer -> system, JSON-text -> object arguments, video_url -> video,
preserve_thinking against the official Qwen3.6 template) or written by hand from the format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from ninfer.chat.template import ChatTemplate, load_default_template

SAME = "same"
PREFILL = "prefill"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather — in °C",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]

TOOLS_TURN_BODY = (
    "# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": '
    '"Current weather — in °C", "parameters": {"type": "object", "properties": '
    '{"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}\n'
    "</tools>\n\n"
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n"
    "</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
    "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> "
    "block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE "
    "the function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your "
    "current knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>"
)

GEN = "<|im_start|>assistant\n<think>\n"
GEN_NO_THINK = "<|im_start|>assistant\n<think>\n\n</think>\n\n"

CALL_ARGS = {"city": "Paris", "days": 3, "metric": True, "extra": None, "opts": {"a": [1, "x"]}}
CALL_XML = (
    "<tool_call>\n<function=get_weather>\n"
    "<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n"
    "<parameter=metric>\nTrue\n</parameter>\n"
    "<parameter=extra>\nNone\n</parameter>\n"
    '<parameter=opts>\n{"a": [1, "x"]}\n</parameter>\n'
    "</function>\n</tool_call>"
)


@dataclass
class Case:
    id: str
    messages: list[dict]
    expected: str
    official: str | None = SAME
    tools: list[dict] | None = None
    add_generation_prompt: bool = True
    kwargs: dict[str, Any] = field(default_factory=dict)


def _user(text: Any) -> dict:
    return {"role": "user", "content": text}


CASES = [
    Case("user_only", [_user("Hello")], "<|im_start|>user\nHello<|im_end|>\n" + GEN),
    Case(
        "system_first",
        [{"role": "system", "content": "You are terse. "}, _user("  Hi\n")],
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" + GEN,
    ),
    Case(
        "system_mid_conversation",
        [
            _user("Hi"),
            {"role": "assistant", "content": "Hello!"},
            {"role": "system", "content": "Answer in French."},
            _user("Why?"),
        ],
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>system\nAnswer in French.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n" + GEN,
        official=None,
    ),
    Case(
        "developer_first",
        [{"role": "developer", "content": "Be brief."}, _user("Hi")],
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" + GEN,
        official=None,
    ),
    Case(
        "developer_after_system",
        [
            {"role": "system", "content": "S"},
            {"role": "developer", "content": [{"type": "text", "text": "D1 "}, {"text": "D2"}]},
            _user("Q"),
        ],
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>system\nD1 D2<|im_end|>\n"
        "<|im_start|>user\nQ<|im_end|>\n" + GEN,
        official=None,
    ),
    Case(
        "user_text_parts",
        [_user([{"type": "text", "text": "Describe "}, {"type": "text", "text": "this."}])],
        "<|im_start|>user\nDescribe this.<|im_end|>\n" + GEN,
    ),
    Case(
        "reasoning_history_dropped",
        [
            _user("Q1"),
            {"role": "assistant", "reasoning_content": "R1", "content": "A1"},
            _user("Q2"),
        ],
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n" + GEN,
    ),
    Case(
        "reasoning_history_preserved",
        [
            _user("Q1"),
            {"role": "assistant", "reasoning_content": "\nR1\n", "content": "A1"},
            {"role": "assistant", "content": "A2"},
            _user("Q2"),
        ],
        "<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nA2<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n" + GEN,
        official=None,
        kwargs={"preserve_thinking": True},
    ),
    Case(
        "reasoning_after_last_query_kept",
        [
            _user("Q"),
            {"role": "assistant", "reasoning_content": " R ", "content": "A"},
        ],
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\nR\n</think>\n\nA"
        "<|im_end|>\n" + GEN,
    ),
    Case(
        "reasoning_inline_in_content",
        [
            _user("Q"),
            {"role": "assistant", "content": "<think>\nR\n</think>\n\nA"},
            _user("Q2"),
            {"role": "assistant", "content": "<think>\nR2\n</think>\n\nA2"},
        ],
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nR2\n</think>\n\nA2<|im_end|>\n" + GEN,
    ),
    Case(
        "thinking_off",
        [_user("Hi")],
        "<|im_start|>user\nHi<|im_end|>\n" + GEN_NO_THINK,
        kwargs={"enable_thinking": False},
    ),
    Case(
        "tools_declared_with_system",
        [{"role": "system", "content": "Be helpful."}, _user("Weather?")],
        "<|im_start|>system\n" + TOOLS_TURN_BODY + "\n\nBe helpful.<|im_end|>\n"
        "<|im_start|>user\nWeather?<|im_end|>\n" + GEN,
        tools=TOOLS,
    ),
    Case(
        "tools_declared_without_system",
        [_user("Weather?")],
        "<|im_start|>system\n" + TOOLS_TURN_BODY + "<|im_end|>\n"
        "<|im_start|>user\nWeather?<|im_end|>\n" + GEN,
        tools=TOOLS,
    ),
    Case(
        "tool_call_object_arguments",
        [
            _user("Q"),
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": CALL_ARGS},
                    }
                ],
            },
        ],
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "Let me check.\n\n" + CALL_XML + "<|im_end|>\n" + GEN,
    ),
    Case(
        "tool_call_string_arguments",
        [
            _user("Q"),
            {
                "role": "assistant",
                "content": "Let me check.",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city": "Paris", "days": 3, "metric": true, '
                            '"extra": null, "opts": {"a": [1, "x"]}}',
                        },
                    }
                ],
            },
        ],
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "Let me check.\n\n" + CALL_XML + "<|im_end|>\n" + GEN,
        official=None,
    ),
    Case(
        "parallel_tool_calls_then_grouped_results",
        [
            _user("Paris and Rome?"),
            {
                "role": "assistant",
                "reasoning_content": "Two cities.",
                "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {"name": "get_weather", "arguments": {"city": "Rome"}},
                ],
            },
            {"role": "tool", "content": "18"},
            {"role": "tool", "content": [{"type": "text", "text": "21"}]},
        ],
        "<|im_start|>user\nParis and Rome?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nTwo cities.\n</think>\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
        "</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n18\n</tool_response>\n"
        "<tool_response>\n21\n</tool_response><|im_end|>\n" + GEN,
    ),
    Case(
        "single_tool_result_then_answer",
        [
            _user("Weather?"),
            {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather"}}]},
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "reasoning_content": "Done.", "content": "It is sunny."},
            _user("Thanks"),
        ],
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n</function>\n</tool_call>"
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nIt is sunny.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n" + GEN,
    ),
    Case(
        # The official template opens no user turn for a tool result that starts the
        # conversation; protocol validation never sends one, parity keeps the quirk.
        "tool_result_opening_conversation",
        [{"role": "tool", "content": "early"}, _user("Q")],
        "\n<tool_response>\nearly\n</tool_response><|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
        + GEN,
    ),
    Case(
        "assistant_prefill",
        [_user("Count to three."), {"role": "assistant", "content": "One, two"}],
        "<|im_start|>user\nCount to three.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nOne, two",
        official=PREFILL,
        add_generation_prompt=False,
    ),
    Case(
        "final_assistant_with_tool_call_is_closed",
        [_user("Q"), {"role": "assistant", "tool_calls": [{"name": "f", "arguments": {}}]}],
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "<tool_call>\n<function=f>\n</function>\n</tool_call><|im_end|>\n",
        add_generation_prompt=False,
    ),
    Case(
        "no_generation_prompt",
        [_user("Hi")],
        "<|im_start|>user\nHi<|im_end|>\n",
        add_generation_prompt=False,
    ),
    Case(
        "images_and_video",
        [
            _user(
                [
                    {"type": "image", "image": "a.png"},
                    {"type": "text", "text": "Compare with "},
                    {"type": "image_url", "image_url": {"url": "data:,"}},
                    {"type": "video", "video": "v.mp4"},
                ]
            )
        ],
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Compare with "
        "<|vision_start|><|image_pad|><|vision_end|>"
        "<|vision_start|><|video_pad|><|vision_end|><|im_end|>\n" + GEN,
    ),
    Case(
        "vision_ids_across_messages",
        [
            _user([{"type": "image"}, {"type": "video"}]),
            {"role": "assistant", "content": "ok"},
            _user(
                [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "?"}]
            ),
        ],
        "<|im_start|>user\nPicture 1: <|vision_start|><|image_pad|><|vision_end|>"
        "Video 1: <|vision_start|><|video_pad|><|vision_end|><|im_end|>\n"
        "<|im_start|>assistant\nok<|im_end|>\n"
        "<|im_start|>user\nPicture 2: <|vision_start|><|image_pad|><|vision_end|>?<|im_end|>\n"
        + GEN,
        kwargs={"add_vision_id": True},
    ),
    Case(
        "video_url_part",
        [_user([{"type": "video_url", "video_url": {"url": "https://v"}}, {"text": "Summarise"}])],
        "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>Summarise<|im_end|>\n" + GEN,
        official=None,
    ),
    Case(
        "tool_result_with_image",
        [
            _user("Screenshot?"),
            {"role": "assistant", "tool_calls": [{"name": "shot", "arguments": {}}]},
            {"role": "tool", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        ],
        "<|im_start|>user\nScreenshot?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        "<tool_call>\n<function=shot>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n<|vision_start|><|image_pad|><|vision_end|>\n"
        "</tool_response><|im_end|>\n" + GEN,
    ),
    Case(
        "unknown_kwargs_pass_through",
        [_user("Hi")],
        "<|im_start|>user\nHi<|im_end|>\n" + GEN,
        kwargs={"reasoning_effort": "high", "client_hint": {"x": 1}},
    ),
    Case(
        "no_user_query",
        [{"role": "system", "content": "S"}, {"role": "assistant", "content": "A"}],
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nA"
        "<|im_end|>\n" + GEN,
        official=None,
    ),
]


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate(load_default_template())


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_golden(template: ChatTemplate, case: Case) -> None:
    rendered = template.render(
        case.messages,
        tools=case.tools,
        add_generation_prompt=case.add_generation_prompt,
        **case.kwargs,
    )
    assert rendered == case.expected
