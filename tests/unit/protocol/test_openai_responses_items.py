"""Responses input Items: normalization (ids, parts, rejections) and lowering to messages."""

from __future__ import annotations

from typing import Any

import pytest

from ninfer.protocol.errors import ProtocolError
from ninfer.protocol.openai_responses import engine_tool_name
from ninfer.protocol.openai_responses_items import (
    has_user_message,
    lower_items,
    normalize_input,
)


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text, **extra}


def reasoning(text: str) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }


def said(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text}],
    }


def call(call_id: str, name: str = "f", args: str = '{"a": 1}', **extra: Any) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": args, **extra}


def result(call_id: str, output: Any = "ok", **extra: Any) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output, **extra}


def lower(items: list[dict[str, Any]], num_history: int = 0) -> list[dict[str, Any]]:
    return lower_items(normalize_input(items), engine_tool_name, num_history=num_history)


def error(fn: Any, *args: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        fn(*args)
    return info.value


# -- normalization ------------------------------------------------------------------------------


def test_string_input_is_one_user_input_text_message() -> None:
    (item,) = normalize_input("hello")
    assert item["type"] == "message" and item["role"] == "user"
    assert item["content"] == [{"type": "input_text", "text": "hello"}]


def test_ids_are_preserved_or_generated_with_type_prefixes() -> None:
    items = normalize_input(
        [user("a", id="mine"), reasoning("r"), said("s"), call("c1"), result("c1")]
    )
    assert items[0]["id"] == "mine"
    prefixes = [item["id"].split("_")[0] + "_" for item in items[1:]]
    assert prefixes == ["rs_", "msg_", "fc_", "fco_"]
    assert len({item["id"] for item in items}) == 5


def test_duplicate_ids_fail() -> None:
    err = error(normalize_input, [user("a", id="x"), user("b", id="x")])
    assert err.code == "duplicate_id" and err.param == "input[1].id"


def test_easy_message_form_and_string_assistant_content() -> None:
    items = normalize_input(
        [{"role": "assistant", "content": "hi"}, {"role": "developer", "content": "d"}]
    )
    assert items[0]["content"] == [{"type": "output_text", "text": "hi", "annotations": []}]
    assert items[1]["content"] == [{"type": "input_text", "text": "d"}]


def test_status_phase_and_breakpoints_are_kept_as_metadata() -> None:
    part = {"type": "input_text", "text": "t", "prompt_cache_breakpoint": {"mode": "explicit"}}
    (item,) = normalize_input(
        [{"role": "user", "content": [part], "status": "completed", "phase": "x"}]
    )
    assert item["status"] == "completed" and item["phase"] == "x"
    assert item["content"][0]["prompt_cache_breakpoint"] == {"mode": "explicit"}


@pytest.mark.parametrize(
    ("item", "param", "code"),
    [
        ({"type": "item_reference", "id": "x"}, "input[0].type", "unsupported_parameter"),
        ({"type": "message", "role": "tool", "content": "x"}, "input[0].role", "invalid_value"),
        (
            {"role": "user", "content": [{"type": "input_file", "file_id": "f"}]},
            "input[0].content[0]",
            "unsupported_parameter",
        ),
        (
            {"role": "user", "content": [{"type": "input_audio"}]},
            "input[0].content[0]",
            "unsupported_parameter",
        ),
        (
            {"role": "user", "content": [{"type": "input_image", "image_url": "ftp://x"}]},
            "input[0].content[0].image_url",
            "invalid_media",
        ),
        (
            {"role": "user", "content": [{"type": "input_image", "file_id": "f"}]},
            "input[0].content[0].file_id",
            "unsupported_parameter",
        ),
        (
            {
                "role": "user",
                "content": [{"type": "input_image", "image_url": "data:,", "detail": "low"}],
            },
            "input[0].content[0].detail",
            "unsupported_parameter",
        ),
        (
            {"role": "assistant", "content": [{"type": "input_video", "video_url": "data:,"}]},
            "input[0].content[0]",
            "unsupported_parameter",
        ),
        (
            {"role": "user", "content": [{"type": "output_text", "text": "x"}]},
            "input[0].content[0].type",
            "invalid_value",
        ),
        (
            {"role": "user", "content": [{"type": "input_text", "text": 1}]},
            "input[0].content[0].text",
            "invalid_type",
        ),
        (
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
            "input[0].content",
            "unsupported_parameter",
        ),
        (
            {"type": "reasoning", "summary": [], "encrypted_content": 5},
            "input[0].encrypted_content",
            "invalid_type",
        ),
        (call("c", status="in_progress"), "input[0].status", "unsupported_parameter"),
        (call("c", args="[1]"), "input[0].arguments", "invalid_value"),
        (call("c", args="{"), "input[0].arguments", "invalid_value"),
        (
            {"type": "function_call", "name": "f", "arguments": "{}"},
            "input[0].call_id",
            "missing_required_parameter",
        ),
        (result("c", output=[]), "input[0].output", "invalid_value"),
        (result("c", output=5), "input[0].output", "invalid_type"),
        (
            result("c", output=[{"type": "input_image", "image_url": "x"}]),
            "input[0].output[0].image_url",
            "invalid_media",
        ),
        (
            result("c", output=[{"type": "input_file"}]),
            "input[0].output[0].type",
            "unsupported_parameter",
        ),
        (result("c", status="incomplete"), "input[0].status", "unsupported_parameter"),
        (user("x", id=""), "input[0].id", "invalid_type"),
    ],
)
def test_item_rejections(item: dict[str, Any], param: str, code: str) -> None:
    err = error(normalize_input, [item])
    assert (err.param, err.code) == (param, code), err


# -- lowering ---------------------------------------------------------------------------------


def test_assistant_items_group_into_one_turn_in_representable_order() -> None:
    items = [user("q"), reasoning("think "), reasoning("more"), said("A"), said("B")]
    items += [call("c1"), call("c2", "g"), result("c1", "r1"), result("c2", "r2")]
    messages = lower(items)
    assert messages == [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "AB",
            "reasoning_content": "think more",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a": 1}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "g", "arguments": '{"a": 1}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r1"},
        {"role": "tool", "tool_call_id": "c2", "content": "r2"},
    ]


def test_results_are_reordered_to_call_declaration_order() -> None:
    messages = lower(
        [user("q"), call("c1"), call("c2"), result("c2", "second"), result("c1", "first")]
    )
    assert [m.get("tool_call_id") for m in messages[2:]] == ["c1", "c2"]
    assert [m["content"] for m in messages[2:]] == ["first", "second"]


def test_reasoning_only_turn_and_refusal_text_are_kept() -> None:
    refusal = {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}
    messages = lower([user("q"), reasoning("r"), user("again"), refusal])
    assert messages[1] == {"role": "assistant", "content": "", "reasoning_content": "r"}
    assert messages[3] == {"role": "assistant", "content": "no"}


def test_system_and_developer_keep_their_positions() -> None:
    items = [
        user("a"),
        {"role": "system", "content": "s"},
        said("x"),
        {"role": "developer", "content": "d"},
    ]
    assert [m["role"] for m in lower(items)] == ["user", "system", "assistant", "developer"]


def test_namespaced_calls_use_the_engine_name() -> None:
    messages = lower([user("q"), call("c1", "get_current", namespace="mcp__weather"), result("c1")])
    assert messages[1]["tool_calls"][0]["function"]["name"] == "mcp__weather__get_current"


def test_result_parts_join_in_order() -> None:
    parts = [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]
    assert lower([user("q"), call("c"), result("c", parts)])[2]["content"] == "ab"


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([user("q"), said("a"), reasoning("r")], "input[2]"),
        ([user("q"), call("c"), said("a"), result("c")], "input[2]"),
        ([user("q"), call("c"), reasoning("r")], "input[2]"),
    ],
)
def test_unrepresentable_assistant_order_fails(items: list[dict[str, Any]], param: str) -> None:
    err = error(lower, items)
    assert (err.code, err.param) == ("invalid_assistant_history", param)


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([user("q"), result("c")], "input[1]"),  # no call at all
        ([user("q"), call("c"), result("zzz")], "input[2]"),  # unknown call_id
        ([user("q"), call("c"), result("c"), result("c")], "input[3]"),  # duplicate
        ([user("q"), call("a"), call("b"), result("a")], "input[3]"),  # partial set
        ([user("q"), call("c"), user("x"), result("c")], "input[3]"),  # not the preceding turn
        ([user("q"), call("c"), result("c", name="other")], "input[2]"),  # name assertion
        ([user("q"), call("c", namespace="n"), result("c", namespace="m")], "input[2]"),
        (
            [user("q"), call("c"), result("c"), user("y"), call("c"), result("c")],
            "input[4].call_id",
        ),
    ],
)
def test_invalid_tool_history(items: list[dict[str, Any]], param: str) -> None:
    err = error(lower, items)
    assert (err.code, err.param) == ("invalid_tool_history", param), err


def test_matching_name_assertion_is_accepted() -> None:
    items = [user("q"), call("c", "get", namespace="n"), result("c", name="get", namespace="n")]
    assert lower(items)[2]["tool_call_id"] == "c"


def test_errors_in_stored_history_point_at_previous_response_id() -> None:
    history = normalize_input([user("q"), call("c")])
    new = normalize_input([result("zzz")])
    err = error(lambda: lower_items(history + new, engine_tool_name, num_history=2))
    assert err.param == "input[0]"
    err = error(
        lambda: lower_items(
            [*normalize_input([result("c")]), *history], engine_tool_name, num_history=2
        )
    )
    assert err.param == "previous_response_id"


def test_results_may_answer_calls_from_stored_history() -> None:
    history = normalize_input([user("q"), call("c")])
    messages = lower_items(
        history + normalize_input([result("c", "r")]), engine_tool_name, num_history=2
    )
    assert messages[-1] == {"role": "tool", "tool_call_id": "c", "content": "r"}


def test_has_user_message() -> None:
    assert has_user_message(normalize_input("x"))
    assert not has_user_message(normalize_input([{"role": "developer", "content": "d"}, said("a")]))


def test_media_parts_lower_to_template_parts() -> None:
    items = normalize_input(
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "see "},
                    {"type": "input_image", "image_url": "https://e.x/a.png", "detail": "auto"},
                    {"type": "input_video", "video_url": "data:video/mp4;base64,AAAA"},
                ],
            },
            call("c"),
            result(
                "c",
                output=[
                    {"type": "input_text", "text": "shot:"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                ],
            ),
        ]
    )
    assert items[0]["content"][1] == {"type": "input_image", "image_url": "https://e.x/a.png"}
    messages = lower_items(items, lambda ns, name: name)
    assert messages[0]["content"] == [
        {"type": "text", "text": "see "},
        {"type": "image", "image": "https://e.x/a.png", "source_param": "input[0].content[1]"},
        {
            "type": "video",
            "video": "data:video/mp4;base64,AAAA",
            "source_param": "input[0].content[2]",
        },
    ]
    assert messages[2]["content"] == [
        {"type": "text", "text": "shot:"},
        {
            "type": "image",
            "image": "data:image/png;base64,AAAA",
            "source_param": "input[2].output[1]",
        },
    ]
