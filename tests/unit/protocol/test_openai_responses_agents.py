"""Responses features real coding agents send: encrypted reasoning, custom / local_shell / hosted
tools, verbosity, single-call turns, and one 400 naming every problem.

Request shapes follow openai/codex's public source (each test names the file it mirrors):
codex-rs/codex-api/src/common.rs (`ResponsesApiRequest`: include, store, parallel_tool_calls,
text.verbosity), codex-rs/protocol/src/models.rs (`ResponseItem`: how reasoning, custom and
local-shell calls are replayed), codex-rs/core/src/tools/handlers/apply_patch.rs and
codex-rs/core/src/client_common.rs (`ToolSpec`: custom/freeform, local_shell, web_search).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ninfer.protocol.errors import ProtocolError
from ninfer.protocol.openai_responses import (
    ENCRYPTED_REASONING,
    engine_tool_name,
    parse_input_tokens_request,
    parse_responses_request,
)
from ninfer.protocol.openai_responses_items import lower_items, normalize_input
from ninfer.protocol.openai_responses_render import (
    OutputBuilder,
    ResponseStatus,
    response_object,
)
from ninfer.protocol.reasoning_seal import ReasoningSeal, key_from_text

KEY = key_from_text("test key")
# codex-rs/core/src/tools/handlers/apply_patch.rs: create_apply_patch_freeform_tool(); the
# grammar is the first lines of its apply_patch.lark.
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool, so do not "
    "wrap the patch in JSON.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": 'start: begin_patch hunk+ end_patch\nbegin_patch: "*** Begin Patch" LF\n',
    },
}
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Runs a shell command and returns its output.",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "array", "items": {"type": "string"}}},
        "required": ["command"],
        "additionalProperties": False,
    },
}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": "hi", **fields}


def rejection(fields: dict[str, Any]) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_responses_request(fields)
    return info.value


# -- reasoning.encrypted_content ----------------------------------------------------------------


def test_seal_round_trips_and_binds_key_and_model() -> None:
    seal = ReasoningSeal(KEY, "model-a")
    text = "Let me think about 'é' and \U0001f600\n</think> is text here"
    sealed = seal.seal(text)
    assert sealed.startswith("nr1.") and sealed.isascii()
    assert seal.open(sealed) == text
    assert ReasoningSeal(KEY, "model-b").open(sealed) is None
    assert ReasoningSeal(key_from_text("other"), "model-a").open(sealed) is None
    assert ReasoningSeal(None, "model-a").open(sealed) is None  # a restart without a stable key


@pytest.mark.parametrize(
    "forged",
    ["", "nr1", "nr1..", "nr2.e30.AAAA", "nr1.!!!.###", "gAAAAABh-opaque-openai", 5, None, "ü"],
)
def test_seal_never_raises_on_foreign_content(forged: Any) -> None:
    assert ReasoningSeal(KEY, "m").open(forged) is None


def test_seal_rejects_a_tampered_payload() -> None:
    seal = ReasoningSeal(KEY, "m")
    version, payload, tag = seal.seal("secret plan").split(".")
    other = seal.seal("other plan").split(".")[1]
    assert seal.open(f"{version}.{other}.{tag}") is None
    assert seal.open(f"{version}.{payload}.{tag[:-2]}") is None


def test_include_encrypted_content_is_accepted_with_store_false() -> None:
    # codex-rs/codex-api/src/common.rs: every request sends include + store:false
    req = parse_responses_request(body(include=[ENCRYPTED_REASONING], store=False))
    assert req.include_encrypted_reasoning and not req.store
    assert not parse_responses_request(body(include=[])).include_encrypted_reasoning


def test_reasoning_items_carry_encrypted_content_when_included() -> None:
    seal = ReasoningSeal(KEY, "m")
    builder = OutputBuilder(lambda n: (None, n), seal=seal.seal)
    builder.reasoning("step one")
    builder.reasoning(" and two")
    events = builder.content("answer")
    done = next(e for e in events if e["type"] == "response.output_item.done")
    item = done["item"]
    assert item["type"] == "reasoning"
    assert seal.open(item["encrypted_content"]) == "step one and two"
    assert item["content"] == [{"type": "reasoning_text", "text": "step one and two"}]
    plain = OutputBuilder(lambda n: (None, n))
    plain.reasoning("x")
    plain.finish(ResponseStatus.COMPLETED)
    assert "encrypted_content" not in plain.output[0]


def codex_reasoning(encrypted: str, *, null_content: bool) -> dict[str, Any]:
    """codex-rs/protocol/src/models.rs `ResponseItem::Reasoning` as Codex serializes it: no id,
    the raw reasoning_text content skipped, `content: null` in versions before
    omit_null_encrypted_content (codex-rs/codex-api/src/common.rs) removed it."""
    item: dict[str, Any] = {
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Thinking about the tool."}],
        "encrypted_content": encrypted,
    }
    if null_content:
        item["content"] = None
    return item


def history(reasoning_item: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        reasoning_item,
        {
            "type": "function_call",
            "name": "shell",
            "arguments": '{"command":["ls"]}',
            "call_id": "call_1",
        },  # fmt: skip
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"},
    ]


@pytest.mark.parametrize("null_content", [True, False])
def test_replayed_encrypted_reasoning_rebuilds_the_same_messages(null_content: bool) -> None:
    seal = ReasoningSeal(KEY, "m")
    raw = {"type": "reasoning", "summary": [], "content": [
        {"type": "reasoning_text", "text": "I should list the files."}]}  # fmt: skip
    replayed = codex_reasoning(seal.seal("I should list the files."), null_content=null_content)
    with_content = lower_items(normalize_input(history(raw)), engine_tool_name)
    from_seal = lower_items(normalize_input(history(replayed), seal=seal), engine_tool_name)
    assert from_seal == with_content
    assert from_seal[1]["reasoning_content"] == "I should list the files."


def test_foreign_encrypted_reasoning_is_omitted_not_an_error() -> None:
    seal = ReasoningSeal(KEY, "m")
    foreign = codex_reasoning("gAAAAABopaque-from-another-server", null_content=True)
    items = normalize_input(history(foreign), seal=seal)
    assert "content" not in items[1] and items[1]["encrypted_content"].startswith("gAAAA")
    messages = lower_items(items, engine_tool_name)
    assert "reasoning_content" not in messages[1]
    no_reasoning = [item for i, item in enumerate(history(foreign)) if i != 1]
    assert messages == lower_items(normalize_input(no_reasoning), engine_tool_name)
    # without any seal (e.g. a count request of another server) the same holds
    assert lower_items(normalize_input(history(foreign)), engine_tool_name) == messages


def test_summary_only_reasoning_is_still_rejected() -> None:
    item = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]}
    with pytest.raises(ProtocolError) as info:
        normalize_input([item])
    assert info.value.param == "input[0].content"


# -- custom (freeform) tools --------------------------------------------------------------------


def test_custom_tool_is_offered_as_one_string_input_with_its_grammar() -> None:
    req = parse_responses_request(body(tools=[APPLY_PATCH, SHELL]))
    (patch, shell) = req.tools.template_tools or []
    fn = patch["function"]
    assert fn["name"] == "apply_patch"
    assert fn["parameters"]["properties"] == {
        "input": {"type": "string", "description": "The raw input text."}
    }
    assert fn["parameters"]["required"] == ["input"]
    assert APPLY_PATCH["description"] in fn["description"]
    assert "lark grammar" in fn["description"]
    assert APPLY_PATCH["format"]["definition"] in fn["description"]
    assert req.tools.kind("apply_patch") == "custom" and req.tools.kind("shell") == "function"
    assert req.tools.declared == [APPLY_PATCH, SHELL]  # echoed as declared


def test_custom_tool_call_items_and_stream_events() -> None:
    req = parse_responses_request(body(tools=[APPLY_PATCH]))
    builder = OutputBuilder(req.tools.identity, kind=req.tools.kind)
    patch = "*** Begin Patch\n*** Add File: a.txt\n+hi\n*** End Patch\n"
    events = builder.tool_call("apply_patch", json.dumps({"input": patch}))
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
    ]
    item = builder.output[0]
    assert item["type"] == "custom_tool_call" and item["status"] == "completed"
    assert item["name"] == "apply_patch" and item["input"] == patch
    assert item["id"].startswith("ctc_") and item["call_id"].startswith("call_")
    assert events[0]["item"]["input"] == "" and events[2]["input"] == patch
    assert events[1]["delta"] == patch and events[1]["item_id"] == item["id"]
    assert builder.has_tool_calls


def test_custom_call_with_other_arguments_stays_a_function_call() -> None:
    req = parse_responses_request(body(tools=[APPLY_PATCH]))
    builder = OutputBuilder(req.tools.identity, kind=req.tools.kind)
    builder.tool_call("apply_patch", '{"a": 1, "b": 2}')
    assert builder.output[0]["type"] == "function_call"
    assert builder.output[0]["arguments"] == '{"a": 1, "b": 2}'


def test_custom_tool_history_lowers_to_the_offered_call_shape() -> None:
    # codex-rs/protocol/src/models.rs: CustomToolCall {status?, call_id, name, input} and
    # CustomToolCallOutput {call_id, output}
    items = normalize_input(
        [
            {"type": "message", "role": "user", "content": "patch it"},
            {
                "type": "custom_tool_call",
                "status": "completed",
                "call_id": "c1",
                "name": "apply_patch",
                "input": "*** Begin Patch\n*** End Patch\n",
            },
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"},
        ]  # fmt: skip
    )
    assert items[1]["id"].startswith("ctc_") and items[2]["id"].startswith("ctco_")
    messages = lower_items(items, engine_tool_name)
    (call,) = messages[1]["tool_calls"]
    assert call["function"] == {
        "name": "apply_patch",
        "arguments": json.dumps({"input": "*** Begin Patch\n*** End Patch\n"}),
    }
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "Done!"}


# -- local_shell --------------------------------------------------------------------------------


def test_local_shell_is_offered_with_its_action_schema() -> None:
    # codex-rs/core/src/client_common.rs: ToolSpec::LocalShell {} serializes as {"type": ...}
    req = parse_responses_request(body(tools=[{"type": "local_shell"}]))
    (tool,) = req.tools.template_tools or []
    params = tool["function"]["parameters"]
    assert tool["function"]["name"] == "local_shell"
    assert params["required"] == ["command"]
    assert params["properties"]["command"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": params["properties"]["command"]["description"],
    }
    assert set(params["properties"]) == {
        "command",
        "working_directory",
        "timeout_ms",
        "env",
        "user",
    }


def test_local_shell_calls_come_back_as_local_shell_call_items() -> None:
    req = parse_responses_request(body(tools=[{"type": "local_shell"}]))
    builder = OutputBuilder(req.tools.identity, kind=req.tools.kind)
    events = builder.tool_call("local_shell", '{"command": ["ls", "-la"], "timeout_ms": 500}')
    item = builder.output[0]
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.output_item.done",
    ]
    # codex-rs/protocol/src/models.rs LocalShellCall / LocalShellExecAction
    assert item["type"] == "local_shell_call" and item["status"] == "completed"
    assert item["action"] == {
        "type": "exec",
        "command": ["ls", "-la"],
        "timeout_ms": 500,
        "working_directory": None,
        "env": None,
        "user": None,
    }
    builder.tool_call("local_shell", '{"command": "ls -la"}')  # not an argv: kept as function_call
    assert builder.output[1]["type"] == "function_call"


def test_local_shell_history_with_function_call_output() -> None:
    # Codex answers a local_shell_call with a function_call_output of the same call_id.
    items = normalize_input(
        [
            {"type": "message", "role": "user", "content": "list"},
            {
                "type": "local_shell_call",
                "call_id": "s1",
                "status": "completed",
                "action": {
                    "type": "exec",
                    "command": ["ls"],
                    "timeout_ms": None,
                    "working_directory": "/tmp",
                    "env": None,
                    "user": None,
                },
            },
            {"type": "function_call_output", "call_id": "s1", "output": "a.txt"},
            {
                "type": "local_shell_call",
                "call_id": "s2",
                "status": "completed",
                "action": {"type": "exec", "command": ["pwd"]},
            },
            {"type": "local_shell_call_output", "id": "s2", "output": "/tmp"},
        ]  # fmt: skip
    )
    messages = lower_items(items, engine_tool_name)
    assert messages[1]["tool_calls"][0]["function"] == {
        "name": "local_shell",
        "arguments": json.dumps({"command": ["ls"], "working_directory": "/tmp"}),
    }
    assert messages[2]["content"] == "a.txt"
    assert messages[4] == {"role": "tool", "tool_call_id": "s2", "content": "/tmp"}


# -- hosted tools, verbosity, parallel_tool_calls -----------------------------------------------


def test_hosted_tools_are_accepted_and_not_offered() -> None:
    # web_search as Codex sends it (codex-rs/core/src/client_common.rs ToolSpec::WebSearch)
    hosted = [
        {"type": "web_search", "external_web_access": False},
        {"type": "image_generation", "output_format": "png"},
        {"type": "web_search"},
    ]
    req = parse_responses_request(body(tools=[SHELL, *hosted]))
    assert [t["function"]["name"] for t in req.tools.template_tools or []] == ["shell"]
    assert req.tools.ignored == ("web_search", "image_generation")
    assert req.tools.declared == [SHELL, *hosted]
    only_hosted = parse_responses_request(body(tools=hosted[:1]))
    assert only_hosted.tools.template_tools is None


@pytest.mark.parametrize("verbosity", ["low", "medium", "high"])
def test_text_verbosity_is_a_neutral_hint_and_echoed(verbosity: str) -> None:
    req = parse_responses_request(body(text={"verbosity": verbosity}))
    obj = response_object(
        response_id="r", created_at=0, model="m", status=ResponseStatus.COMPLETED, output=[],
        request=req, usage=None,
    )  # fmt: skip
    assert obj["text"] == {"format": {"type": "text"}, "verbosity": verbosity}
    assert req.sampling == parse_responses_request(body()).sampling


def test_parallel_tool_calls_false_with_tools_is_accepted() -> None:
    req = parse_responses_request(body(tools=[SHELL], parallel_tool_calls=False))
    assert req.parallel_tool_calls is False


# -- one 400 for every problem ------------------------------------------------------------------


def test_one_error_names_every_unsupported_field() -> None:
    error = rejection(
        body(
            background=True,
            top_logprobs=3,
            include=["message.output_text.logprobs", "file_search_call.results"],
            tools=[SHELL, {**SHELL, "name": "x", "strict": True}, {"type": "computer_use_2099"}],
            input=[{"type": "item_reference", "id": "x"}, {"type": "reasoning", "summary": []}],
            conversation="c",
            surprise=1,
        )
    )
    assert error.status == 400
    for param in (
        "conversation",
        "surprise",
        "background",
        "top_logprobs",
        "include[0]",
        "include[1]",
        "tools[1].strict",
        "tools[2].type",
        "input[0].type",
        "input[1].content",
    ):
        assert param in error.message, param
    assert error.message.startswith("10 problems:")
    assert error.param == "conversation" and error.code == "unsupported_parameter"


def test_a_single_problem_keeps_its_own_error() -> None:
    error = rejection(body(background=True))
    assert error.message.startswith("background:") and error.param == "background"


def test_count_requests_open_encrypted_reasoning_too() -> None:
    seal = ReasoningSeal(KEY, "m")
    replayed = codex_reasoning(seal.seal("plan"), null_content=True)
    req = parse_input_tokens_request({"input": history(replayed)}, seal=seal)
    assert req.input_items[1]["content"] == [{"type": "reasoning_text", "text": "plan"}]
