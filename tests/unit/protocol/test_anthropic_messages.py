"""Anthropic history lowering: system rules, joined turns, tool ordering, prefill, cache_control."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.protocol.anthropic import parse_messages_request
from ninfer.protocol.errors import ProtocolError

CC = {"type": "ephemeral"}
BILLING = "x-anthropic-billing-header: cc_version=2.1; cc_entrypoint=cli"


def _lower(messages: list[dict[str, Any]], **body: Any) -> list[dict[str, Any]]:
    body = {"model": "m", "messages": messages, **body}
    return parse_messages_request(body, default_max_tokens=100).messages


def _error(messages: list[dict[str, Any]], **body: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        _lower(messages, **body)
    return info.value


def _text(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "text", "text": text, **extra}


def _use(call_id: str, name: str = "f", **args: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": args}


def _result(call_id: str, content: Any = "ok", **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": content, **extra}


def test_billing_header_is_consumed_only_as_the_first_system_block() -> None:
    user = [{"role": "user", "content": "q"}]
    out = _lower(user, system=[_text(BILLING, cache_control=CC), _text("A"), _text("B")])
    assert out[0] == {"role": "system", "content": "AB"}
    # positional: a string system value, a later block, or an inline system message stays
    assert _lower(user, system=BILLING)[0]["content"] == BILLING
    assert _lower(user, system=[_text("A"), _text(BILLING)])[0]["content"] == "A" + BILLING
    inline = [{"role": "system", "content": BILLING}, *user]
    assert _lower(inline)[0] == {"role": "system", "content": BILLING}
    # only the header: no system message at all
    assert _lower(user, system=[_text(BILLING)]) == [{"role": "user", "content": "q"}]


def test_billing_block_cache_control_is_consumed_with_it() -> None:
    # four more markers still fit: the consumed block's marker does not count
    system = [_text(BILLING, cache_control=CC)] + [
        _text(str(i), cache_control=CC) for i in range(4)
    ]
    assert _lower([{"role": "user", "content": "q"}], system=system)[0]["content"] == "0123"


def test_consecutive_turns_join_without_separators_and_system_stays_in_place() -> None:
    out = _lower(
        [
            {"role": "user", "content": "a"},
            {"role": "user", "content": [_text("b"), _text("c")]},
            {"role": "assistant", "content": "x"},
            {"role": "assistant", "content": [_text("y")]},
            {"role": "system", "content": "mid"},
            {"role": "user", "content": "z"},
        ]
    )
    assert out == [
        {"role": "user", "content": "abc"},
        {"role": "assistant", "content": "xy"},
        {"role": "system", "content": "mid"},
        {"role": "user", "content": "z"},
    ]


def test_thinking_history_keeps_text_and_ignores_signature() -> None:
    out = _lower(
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "opaque"},
                    _text("answer"),
                ],
            },
            {"role": "user", "content": "again"},
        ]
    )
    assert out[1] == {"role": "assistant", "content": "answer", "reasoning_content": "hmm"}


def test_tool_results_are_matched_by_id_in_call_order() -> None:
    out = _lower(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [_text("calling"), _use("a", x=1), _use("b")]},
            {
                "role": "user",
                "content": [
                    _result("b", [_text("B1"), _text("B2")]),
                    _result("a", "A", is_error=True),
                    _text("thanks"),
                ],
            },
        ]
    )
    assert out[1]["tool_calls"] == [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}},
        {"id": "b", "type": "function", "function": {"name": "f", "arguments": {}}},
    ]
    assert out[2:] == [
        {"role": "tool", "tool_call_id": "a", "content": "[is_error: true]\nA"},
        {"role": "tool", "tool_call_id": "b", "content": "B1B2"},
        {"role": "user", "content": "thanks"},
    ]


def test_history_may_begin_with_results() -> None:
    out = _lower([{"role": "user", "content": [_result("old", "r"), _text("go on")]}])
    assert out == [
        {"role": "tool", "tool_call_id": "old", "content": "r"},
        {"role": "user", "content": "go on"},
    ]


@pytest.mark.parametrize(
    ("messages", "param", "code"),
    [
        (  # a result missing
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [_use("a"), _use("b")]},
                {"role": "user", "content": [_result("a")]},
            ],
            "messages[2]",
            "invalid_tool_result_order",
        ),
        (  # an unknown id
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [_use("a")]},
                {"role": "user", "content": [_result("a"), _result("zz")]},
            ],
            "messages[2]",
            "invalid_tool_result_order",
        ),
        (  # results must lead the turn
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [_use("a")]},
                {"role": "user", "content": [_text("t"), _result("a")]},
            ],
            "messages[2].content[1]",
            "invalid_value",
        ),
        (  # a tool_use turn must be answered next
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [_use("a")]},
                {"role": "system", "content": "s"},
            ],
            "messages[2]",
            "invalid_tool_result_order",
        ),
        (  # an orphan result in mid-history
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": "x"},
                {"role": "user", "content": [_result("a")]},
            ],
            "messages[2]",
            "invalid_tool_result_order",
        ),
        (  # duplicate result
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [_use("a")]},
                {"role": "user", "content": [_result("a"), _result("a")]},
            ],
            "messages[2].content[1].tool_use_id",
            "invalid_value",
        ),
        (
            [{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}],
            "messages[0].content[0].source.media_type",
            "invalid_media",
        ),
        (
            [{"role": "user", "content": [_result("a", [{"type": "image", "source": {}}])]}],
            "messages[0].content[0].content[0].source.type",
            "invalid_value",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [{"type": "image", "source": {"type": "url", "url": "file:///x"}}],
                }
            ],
            "messages[0].content[0].source.url",
            "invalid_media",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "image", "source": {}}]},
                {"role": "user", "content": "q"},
            ],
            "messages[1].content[0].type",
            "unsupported_parameter",
        ),
        (
            [{"role": "user", "content": [{"type": "document", "source": {}}]}],
            "messages[0].content[0].type",
            "unsupported_content",
        ),
        (
            [{"role": "user", "content": [{"type": "search_result", "source": "s"}]}],
            "messages[0].content[0].type",
            "unsupported_content",
        ),
        (
            [
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
                {"role": "user", "content": "q"},
            ],
            "messages[1].content[0].type",
            "unsupported_parameter",
        ),
        (  # prefill restrictions
            [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [{"type": "thinking", "thinking": "t"}, _text("x")],
                },
            ],
            "messages[1].content[0].type",
            "invalid_prefill",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": [_use("a")]}],
            "messages[1].content[0].type",
            "invalid_prefill",
        ),
        (
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": "trailing "}],
            "messages[1].content",
            "invalid_prefill",
        ),
        ([{"role": "tool", "content": "q"}], "messages[0].role", "invalid_value"),
        ([], "messages", "invalid_value"),
        ([{"role": "user", "content": 3}], "messages[0].content", "invalid_type"),
    ],
)
def test_history_rejections_name_the_field(messages, param, code) -> None:
    err = _error(messages)
    assert (err.status, err.param, err.code) == (400, param, code)


def test_image_blocks_lower_to_template_parts_including_tool_results() -> None:
    png = {"type": "base64", "media_type": "image/png", "data": "AAAA"}
    messages = _lower(
        [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [_use("a")]},
            {
                "role": "user",
                "content": [
                    _result(
                        "a",
                        [_text("shot"), {"type": "image", "source": png}],
                        is_error=True,
                    ),
                    {"type": "image", "source": {"type": "url", "url": "https://e.x/b.jpg"}},
                    _text("and this"),
                ],
            },
        ]
    )
    tool, user = messages[-2], messages[-1]
    assert tool["role"] == "tool"
    assert tool["content"][1:] == [
        {"type": "text", "text": "shot"},
        {
            "type": "image",
            "image": "data:image/png;base64,AAAA",
            "source_param": "messages[2].content[0].content[1]",
        },
    ]
    assert tool["content"][0]["type"] == "text"  # the is_error mark leads
    assert user["content"] == [
        {
            "type": "image",
            "image": "https://e.x/b.jpg",
            "source_param": "messages[2].content[1]",
        },
        {"type": "text", "text": "and this"},
    ]


def _marked(n: int, ttl: str = "5m") -> list[dict[str, Any]]:
    cc = {"type": "ephemeral", "ttl": ttl}
    return [{"role": "user", "content": [_text(str(i), cache_control=cc) for i in range(n)]}]


def test_cache_control_breakpoints_and_request_level_rules() -> None:
    assert _lower(_marked(4))[0]["content"] == "0123"
    assert _error(_marked(5)).code == "too_many_cache_breakpoints"
    # request-level merges with an explicit breakpoint at the same target and TTL
    _lower(_marked(4), cache_control={"type": "ephemeral"})
    # ... conflicts at that target with a different TTL
    err = _error(_marked(4), cache_control={"type": "ephemeral", "ttl": "1h"})
    assert (err.param, err.code) == ("cache_control", "conflicting_cache_control")
    # ... and needs a fifth slot when four other targets are taken
    four_then_plain = [{"role": "user", "content": [*_marked(4)[0]["content"], _text("tail")]}]
    err = _error(four_then_plain, cache_control={"type": "ephemeral"})
    assert err.code == "too_many_cache_breakpoints"
    _lower(_marked(3) + [{"role": "assistant", "content": "a"}], cache_control=CC)


@pytest.mark.parametrize(
    ("cc", "param"),
    [
        ({"type": "persistent"}, "messages[0].content[0].cache_control.type"),
        ({"type": "ephemeral", "ttl": "10m"}, "messages[0].content[0].cache_control.ttl"),
        ("ephemeral", "messages[0].content[0].cache_control"),
    ],
)
def test_cache_control_values_are_validated(cc, param) -> None:
    err = _error([{"role": "user", "content": [_text("x", cache_control=cc)]}])
    assert err.param == param


def test_cache_markers_on_tools_count() -> None:
    tools = [
        {"name": f"t{i}", "input_schema": {"type": "object"}, "cache_control": CC} for i in range(3)
    ]
    _lower(_marked(1), tools=tools)
    assert _error(_marked(2), tools=tools).code == "too_many_cache_breakpoints"
