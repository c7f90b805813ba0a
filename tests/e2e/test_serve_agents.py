"""Real coding agents' request shapes replayed against a live server: Codex and Claude Code.

The Codex shapes are written from openai/codex's public source; each request builder names the
file it follows. The Claude Code shapes follow what Claude Code (claude-cli) is publicly known to
send: a `system` array whose first block is the `x-anthropic-billing-header`, ephemeral
`cache_control` breakpoints, JSON-schema tools, extended thinking with a budget, and
`metadata.user_id`. A scripted model (tests/support/scripted_serve.py) sits behind the real
engine, template, tokenizer, output decoder and server, so tool calls are exact.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from e2e.serve_process import MODEL_ID, ServeProcess, serve
from support.scripted_serve import PATCH_TEXT

pytestmark = pytest.mark.e2e

RESPONSES = "/v1/responses"


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    with serve(scripted=True) as s:
        yield s


def post(
    server: ServeProcess, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    conn = server.connection(timeout=60)
    try:
        hdrs = {"content-type": "application/json", **(headers or {})}
        conn.request("POST", path, body=json.dumps(body).encode(), headers=hdrs)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def sse(payload: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs of a named-event stream; the name must equal data.type."""
    out = []
    for frame in payload.decode().split("\n\n"):
        lines = [line for line in frame.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        name = lines[0].removeprefix("event: ")
        data = json.loads(lines[1].removeprefix("data: "))
        assert data["type"] == name
        out.append((name, data))
    return out


# -- Codex --------------------------------------------------------------------------------------

# codex-rs/core/src/openai_tools.rs (create_shell_tool): the `shell` function tool.
SHELL_TOOL = {
    "type": "function",
    "name": "shell",
    "description": "Runs a shell command and returns its output",
    "strict": False,
    "parameters": {
        "type": "object",
        "properties": {
            "command": {"type": "array", "items": {"type": "string"}},
            "workdir": {"type": "string"},
            "timeout": {"type": "number"},
        },
        "required": ["command"],
        "additionalProperties": False,
    },
}
# codex-rs/core/src/tools/handlers/apply_patch.rs (create_apply_patch_freeform_tool) with the
# opening rules of its apply_patch.lark grammar.
APPLY_PATCH_TOOL = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool, so do not "
    "wrap the patch in JSON.",
    "format": {
        "type": "grammar",
        "syntax": "lark",
        "definition": "start: begin_patch hunk+ end_patch\n"
        'begin_patch: "*** Begin Patch" LF\nend_patch: "*** End Patch" LF?\n',
    },
}
# codex-rs/core/src/client_common.rs (ToolSpec::WebSearch, ToolSpec::LocalShell).
WEB_SEARCH_TOOL = {"type": "web_search", "external_web_access": False}
LOCAL_SHELL_TOOL = {"type": "local_shell"}


def codex_message(role: str, text: str) -> dict[str, Any]:
    """codex-rs/protocol/src/models.rs ResponseItem::Message (id skipped when serializing)."""
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def codex_request(
    prompt_items: list[dict[str, Any]], tools: list[dict[str, Any]], **overrides: Any
) -> dict[str, Any]:
    """codex-rs/codex-api/src/common.rs ResponsesApiRequest as its Serialize impl writes it."""
    body = {
        "model": MODEL_ID,
        "instructions": "You are a coding agent running in the Codex CLI.",
        "input": [
            codex_message("developer", "<permissions instructions>sandboxed</permissions>"),
            codex_message(
                "user", "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"
            ),
            *prompt_items,
        ],
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a213-81c0-7800-8aa1-bbab2a035a53",
        "text": {"verbosity": "low"},
        "client_metadata": {"x-codex-turn": "1"},
    }
    body.update(overrides)
    return body


def completed(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    name, data = events[-1]
    assert name == "response.completed", events[-1]
    return data["response"]


def test_codex_turn_streams_a_freeform_call_and_encrypted_reasoning(server: ServeProcess) -> None:
    tools = [SHELL_TOOL, APPLY_PATCH_TOOL, WEB_SEARCH_TOOL]
    body = codex_request([codex_message("user", "CODEX_PATCH: add hello.txt")], tools)
    status, headers, payload = post(server, RESPONSES, body)
    assert status == 200, payload[:400]
    assert headers["x-ninfer-ignored-tools"] == "web_search"
    events = sse(payload)
    response = completed(events)
    reasoning, call = response["output"]
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"][0]["text"].startswith("THOUGHT_MARK")
    assert reasoning["encrypted_content"].startswith("nr1.")
    assert call["type"] == "custom_tool_call" and call["name"] == "apply_patch"
    assert call["input"] == PATCH_TEXT and call["status"] == "completed"
    names = [name for name, _ in events]
    assert "response.custom_tool_call_input.delta" in names
    done = [d for n, d in events if n == "response.custom_tool_call_input.done"]
    assert done[0]["input"] == PATCH_TEXT and done[0]["item_id"] == call["id"]
    assert response["text"]["verbosity"] == "low" and response["store"] is False
    assert response["tools"] == tools  # echoed as declared, hosted ones included
    status, _, _ = post(server, RESPONSES + "/input_tokens", {"model": MODEL_ID, "input": "x"})
    assert status == 200


def _codex_turn_one(server: ServeProcess) -> dict[str, Any]:
    tools = [SHELL_TOOL, APPLY_PATCH_TOOL, WEB_SEARCH_TOOL]
    body = codex_request([codex_message("user", "CODEX_PATCH: add hello.txt")], tools)
    status, _, payload = post(server, RESPONSES, body)
    assert status == 200
    return completed(sse(payload))


def codex_replay(item: dict[str, Any], *, keep_content: bool = False) -> dict[str, Any]:
    """How Codex sends an output item back (codex-rs/protocol/src/models.rs): no ids; reasoning
    whose content holds reasoning_text is sent without it (`content: null`), keeping only
    summary and encrypted_content; a custom call keeps status, call_id, name and input."""
    if item["type"] == "reasoning":
        out = {"type": "reasoning", "summary": item["summary"], "content": None,
               "encrypted_content": item["encrypted_content"]}  # fmt: skip
        if keep_content:
            out["content"] = item["content"]
        return out
    assert item["type"] == "custom_tool_call"
    return {key: item[key] for key in ("type", "status", "call_id", "name", "input")}


def _turn_two(first: dict[str, Any], reasoning: dict[str, Any]) -> list[dict[str, Any]]:
    _, call = first["output"]
    return [
        codex_message("user", "CODEX_PATCH: add hello.txt"),
        reasoning,
        codex_replay(call),
        # codex-rs/protocol/src/models.rs ResponseInputItem::CustomToolCallOutput
        {
            "type": "custom_tool_call_output",
            "call_id": call["call_id"],
            "output": "Success. Updated: A hello.txt PROBE_HISTORY",
        },  # fmt: skip
    ]


def test_codex_replay_of_encrypted_reasoning_rebuilds_the_prompt(server: ServeProcess) -> None:
    first = _codex_turn_one(server)
    reasoning = first["output"][0]
    tools = [SHELL_TOOL, APPLY_PATCH_TOOL, WEB_SEARCH_TOOL]
    sealed = _turn_two(first, codex_replay(reasoning))
    raw = _turn_two(first, codex_replay(reasoning, keep_content=True))
    forged = _turn_two(first, {**codex_replay(reasoning), "encrypted_content": "gAAAAB-other"})
    without = [item for item in sealed if item["type"] != "reasoning"]

    def count(items: list[dict[str, Any]]) -> int:
        body = codex_request(items, tools)
        keep = ("model", "instructions", "input", "tools", "tool_choice", "parallel_tool_calls",
                "reasoning", "text")  # fmt: skip
        status, _, payload = post(server, RESPONSES + "/input_tokens", {k: body[k] for k in keep})
        assert status == 200, payload[:300]
        return json.loads(payload)["input_tokens"]

    # the same prompt tokens whether the reasoning came back raw or only sealed
    assert count(sealed) == count(raw) > count(forged) == count(without)

    def probe(items: list[dict[str, Any]]) -> str:
        status, _, payload = post(server, RESPONSES, codex_request(items, tools))
        assert status == 200, payload[:300]
        (message,) = [i for i in completed(sse(payload))["output"] if i["type"] == "message"]
        return message["content"][0]["text"]

    assert "thought_mark=yes" in probe(sealed)  # the rebuilt reasoning reached the prompt
    assert "thought_mark=no" in probe(forged)  # a foreign seal is omitted reasoning, no error


def test_codex_local_shell_round_trip(server: ServeProcess) -> None:
    body = codex_request([codex_message("user", "CODEX_SHELL")], [LOCAL_SHELL_TOOL], stream=False)
    status, _, payload = post(server, RESPONSES, body)
    assert status == 200, payload[:300]
    output = json.loads(payload)["output"]
    call = output[-1]
    assert call["type"] == "local_shell_call" and call["status"] == "completed"
    assert call["action"] == {
        "type": "exec",
        "command": ["ls", "-la"],
        "timeout_ms": None,
        "working_directory": "/tmp",
        "env": None,
        "user": None,
    }
    # Codex answers a local_shell_call with a function_call_output carrying its call_id.
    history = [
        codex_message("user", "CODEX_SHELL"),
        {"type": "reasoning", "summary": [], "content": None,
         "encrypted_content": output[0]["encrypted_content"]},
        {key: call[key] for key in ("type", "call_id", "status", "action")},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "total 0 REASON"},
    ]  # fmt: skip
    status, _, payload = post(
        server, RESPONSES, codex_request(history, [LOCAL_SHELL_TOOL], stream=False)
    )
    assert status == 200, payload[:300]
    assert json.loads(payload)["output"][-1]["content"][0]["text"] == "The answer is 42."


@pytest.mark.parametrize("parallel", [True, False])
def test_parallel_tool_calls_false_ends_the_turn_at_the_first_call(
    server: ServeProcess, parallel: bool
) -> None:
    body = codex_request(
        [codex_message("user", "TWO_CALLS")],
        [SHELL_TOOL],
        stream=False,
        parallel_tool_calls=parallel,
    )
    status, _, payload = post(server, RESPONSES, body)
    assert status == 200, payload[:300]
    response = json.loads(payload)
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    commands = [json.loads(call["arguments"])["command"] for call in calls]
    assert commands == ([["ls"], ["pwd"]] if parallel else [["ls"]])
    assert response["status"] == "completed" and response["parallel_tool_calls"] is parallel
    if not parallel:  # generation stopped at the first </tool_call>, not after the second
        first = json.loads(post(server, RESPONSES, {**body, "parallel_tool_calls": True})[2])
        assert response["usage"]["output_tokens"] < first["usage"]["output_tokens"]


def test_every_unsupported_field_is_named_in_one_400(server: ServeProcess) -> None:
    body = codex_request(
        [codex_message("user", "hi")],
        [SHELL_TOOL, {"type": "computer_use_2099"}],
        background=True,
        top_logprobs=2,
        include=["reasoning.encrypted_content", "message.output_text.logprobs"],
        service_tier="flex",
    )
    status, _, payload = post(server, RESPONSES, body)
    error = json.loads(payload)["error"]
    assert status == 400
    for param in ("background", "top_logprobs", "include[1]", "service_tier", "tools[1].type"):
        assert param in error["message"], param


# -- Claude Code --------------------------------------------------------------------------------

CLAUDE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
    "x-app": "cli",
    "user-agent": "claude-cli/2.0.14 (external, cli)",
    "x-api-key": "unused",
}
BASH_TOOL = {
    "name": "Bash",
    "description": "Executes a given bash command in a persistent shell session.",
    "input_schema": {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The command to execute"},
            "timeout": {"type": "number", "description": "Optional timeout in milliseconds"},
            "description": {"type": "string", "description": "What the command does"},
            "run_in_background": {"type": "boolean"},
        },
        "required": ["command"],
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    },
}
READ_TOOL = {
    "name": "Read",
    "description": "Reads a file from the local filesystem.",
    "input_schema": {
        "type": "object",
        "properties": {"file_path": {"type": "string"}, "offset": {"type": "number"}},
        "required": ["file_path"],
        "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#",
    },
    "cache_control": {"type": "ephemeral"},
}
EPHEMERAL = {"type": "ephemeral"}


def claude_code_request(messages: list[dict[str, Any]], **overrides: Any) -> dict[str, Any]:
    body = {
        "model": MODEL_ID,
        "max_tokens": 32000,
        "stream": True,
        "system": [
            {
                "type": "text",
                "text": "x-anthropic-billing-header: cc_version=2.0.14; cc_entrypoint=cli",
            },
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                "cache_control": EPHEMERAL,
            },
            {
                "type": "text",
                "text": "You are an interactive CLI tool that helps users with "
                "software engineering tasks.",
                "cache_control": EPHEMERAL,
            },
        ],  # fmt: skip
        "messages": messages,
        "tools": [BASH_TOOL, READ_TOOL],
        "metadata": {"user_id": "user_3f2a_account__session_5b1c0d9e-7f7a-4a43-9c66-0f7b3a5f1e2d"},
        "thinking": {"type": "enabled", "budget_tokens": 31999},
        "temperature": 1,
    }
    body.update(overrides)
    return body


def user_turn(text: str, *, latest: bool = True) -> dict[str, Any]:
    """Claude Code marks only its latest user message (with system and tools: at most 4)."""
    prompt: dict[str, Any] = {"type": "text", "text": text}
    if latest:
        prompt["cache_control"] = EPHEMERAL
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": "<system-reminder>\nAs you answer, use the todo list.\n"
             "</system-reminder>"},
            prompt,
        ],
    }  # fmt: skip


def test_claude_code_tool_turn_and_its_replay(server: ServeProcess) -> None:
    first = [user_turn("CLAUDE_BASH: run the tests")]
    status, headers, payload = post(
        server, "/v1/messages", claude_code_request(first), CLAUDE_HEADERS
    )
    assert status == 200, payload[:400]
    assert headers["request-id"].startswith("req-")
    blocks: dict[int, dict[str, Any]] = {}
    for name, data in sse(payload):
        if name == "content_block_start":
            blocks[data["index"]] = dict(data["content_block"])
        elif name == "content_block_delta":
            delta, block = data["delta"], blocks[data["index"]]
            for key in ("thinking", "text", "signature", "partial_json"):
                if key in delta:
                    block[key] = block.get(key, "") + delta[key]
        elif name == "message_delta":
            assert data["delta"]["stop_reason"] == "tool_use"
    thinking, text, tool = (blocks[i] for i in sorted(blocks))
    assert thinking["type"] == "thinking" and thinking["signature"]
    assert tool["type"] == "tool_use" and tool["name"] == "Bash"
    tool_input = json.loads(tool.pop("partial_json"))
    assert tool_input == {"command": "pytest -q", "description": "Run tests"}
    # Claude Code replays the assistant turn verbatim (signature included) plus the result.
    replay = [
        user_turn("CLAUDE_BASH: run the tests", latest=False),
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": thinking["thinking"],
             "signature": thinking["signature"]},
            {"type": "text", "text": text["text"]},
            {"type": "tool_use", "id": tool["id"], "name": "Bash", "input": tool_input},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool["id"], "content": "1 passed REASON",
             "is_error": False},
            {"type": "text", "text": "continue", "cache_control": EPHEMERAL},
        ]},
    ]  # fmt: skip
    status, _, payload = post(server, "/v1/messages", claude_code_request(replay), CLAUDE_HEADERS)
    assert status == 200, payload[:400]
    assert any(name == "message_stop" for name, _ in sse(payload)), (
        "the replayed turn must finish normally"
    )
    count = claude_code_request(replay)
    for key in ("stream", "max_tokens", "temperature", "metadata"):
        count.pop(key)
    status, _, payload = post(server, "/v1/messages/count_tokens", count, CLAUDE_HEADERS)
    assert status == 200 and json.loads(payload)["input_tokens"] > 0
