"""OpenAI Responses input Items: validate and normalize them, then lower Items to template messages.

Standard library and `protocol.errors` only (no sanic, torch or engine). Normalized Items are the
canonical, stored and listed form (client order, ids preserved or generated). Lowering is separate
because it runs on the whole reconstructed history (stored parent Items + new input): contiguous
assistant-owned Items become one assistant turn, and tool results are matched to that turn's calls.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ninfer.protocol.errors import (
    ErrorCollector,
    ProtocolError,
    invalid,
    invalid_type,
    unsupported,
)
from ninfer.protocol.media_parts import check_detail, joined, media_url, template_part, text_part
from ninfer.protocol.reasoning_seal import ReasoningSeal

ITEM_ID_PREFIX = {
    "message": "msg_",
    "reasoning": "rs_",
    "function_call": "fc_",
    "function_call_output": "fco_",
    "custom_tool_call": "ctc_",
    "custom_tool_call_output": "ctco_",
    "local_shell_call": "lsh_",
    "local_shell_call_output": "lsho_",
}
MESSAGE_ROLES = ("user", "assistant", "system", "developer")
LOCAL_SHELL = "local_shell"  # the engine tool name of the local_shell tool
# Assistant-owned Items in the one order a Qwen assistant turn can represent.
_CALLS = ("function_call", "custom_tool_call", "local_shell_call")
_RESULTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")
_STAGE = {"reasoning": 0, "message": 1, **dict.fromkeys(_CALLS, 2)}
_ITEM_TYPES = ("message", "reasoning", *_CALLS, *_RESULTS)

ToolNamer = Callable[[str | None, str], str]  # (namespace, name) -> the engine's tool name


def new_item_id(kind: str) -> str:
    return ITEM_ID_PREFIX[kind] + uuid.uuid4().hex


def normalize_input(
    value: Any, param: str = "input", *, seal: ReasoningSeal | None = None
) -> list[dict[str, Any]]:
    """The request's `input` as canonical Items; string input is one user `input_text` message.

    `seal` opens replayed reasoning that carries only `encrypted_content`; without one (or when
    it does not authenticate) such an Item is kept as omitted reasoning. Every bad Item is
    reported in one error.
    """
    if value is None:
        return []
    if isinstance(value, str):
        return [_message_item(new_item_id("message"), "user", [_text_part("input_text", value)])]
    if not isinstance(value, list):
        raise invalid_type(param, "a string or an array of Items", value)
    errors = ErrorCollector()
    items = []
    for i, item in enumerate(value):
        with errors.check():
            items.append(_normalize_item(f"{param}[{i}]", item, seal))
    errors.raise_any()
    seen: set[str] = set()
    for i, item in enumerate(items):
        if item["id"] in seen:
            raise invalid(f"{param}[{i}].id", f"duplicate Item id {item['id']!r}", "duplicate_id")
        seen.add(item["id"])
    return items


def _message_item(item_id: str, role: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": role, "content": content}


def _text_part(kind: str, text: str) -> dict[str, Any]:
    if kind == "output_text":
        return {"type": kind, "text": text, "annotations": []}
    return {"type": kind, "text": text}


def _normalize_item(param: str, item: Any, seal: ReasoningSeal | None) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise invalid_type(param, "an Item object", item)
    kind = item.get("type")
    if kind is None and "role" in item:
        kind = "message"  # the easy message form omits its type
    item_id = item.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not item_id):
        raise invalid_type(f"{param}.id", "a non-empty string", item_id)
    if kind == "message":
        return _normalize_message(param, item, item_id)
    if kind == "reasoning":
        return _normalize_reasoning(param, item, item_id, seal)
    if kind == "function_call":
        return _normalize_call(param, item, item_id)
    if kind == "custom_tool_call":
        return _normalize_custom_call(param, item, item_id)
    if kind == "local_shell_call":
        return _normalize_shell_call(param, item, item_id)
    if kind in _RESULTS:
        return _normalize_output(param, item, item_id, kind)
    if not isinstance(kind, str):
        raise invalid(f"{param}.type", "is required (message, reasoning, function_call, ...)")
    raise unsupported(
        f"{param}.type",
        f"Item type {kind!r} is not supported (supported: {', '.join(_ITEM_TYPES)})",
    )


def _normalize_message(param: str, item: Mapping[str, Any], item_id: str | None) -> dict[str, Any]:
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        raise invalid(f"{param}.role", f"must be one of {', '.join(MESSAGE_ROLES)}, got {role!r}")
    content = item.get("content")
    if isinstance(content, str):
        kind = "output_text" if role == "assistant" else "input_text"
        parts = [_text_part(kind, content)]
    elif isinstance(content, list):
        parts = [_normalize_part(f"{param}.content[{i}]", role, p) for i, p in enumerate(content)]
    else:
        raise invalid_type(f"{param}.content", "a string or an array of content parts", content)
    out = _message_item(item_id or new_item_id("message"), role, parts)
    for name in ("status", "phase"):  # accepted metadata without a prompt representation
        value = item.get(name)
        if value is not None:
            if not isinstance(value, str):
                raise invalid_type(f"{param}.{name}", "a string", value)
            out[name] = value
    return out


def _normalize_part(param: str, role: str, part: Any) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if not isinstance(part, dict) or not isinstance(kind, str):
        raise invalid(param, "must be a content part object with a type")
    if kind in ("input_image", "input_video"):
        if kind == "input_image" and role not in ("user", "assistant"):
            raise unsupported(param, "input_image is only supported in user or assistant messages")
        if kind == "input_video" and role != "user":
            raise unsupported(param, "input_video is only supported in user messages")
        return _media_part(param, kind, part)
    if kind in ("input_text", "output_text"):
        if kind == "output_text" and role != "assistant":
            raise invalid(f"{param}.type", "output_text parts replay assistant messages only")
        text = part.get("text")
        if not isinstance(text, str):
            raise invalid_type(f"{param}.text", "a string", text)
        out = _text_part(kind, text)
        _copy_breakpoint(param, part, out)
        return out
    if kind == "refusal":
        if role != "assistant":
            raise invalid(f"{param}.type", "refusal parts replay assistant messages only")
        text = part.get("refusal")
        if not isinstance(text, str):
            raise invalid_type(f"{param}.refusal", "a string", text)
        return {"type": "refusal", "refusal": text}
    if kind in ("input_file", "input_audio"):
        raise unsupported(param, f"{kind} content is not supported (no file or audio input)")
    raise unsupported(f"{param}.type", f"content part type {kind!r} is not supported")


def _copy_breakpoint(param: str, part: Mapping[str, Any], out: dict[str, Any]) -> None:
    marker = part.get("prompt_cache_breakpoint")
    if marker is None:
        return
    if not isinstance(marker, dict) or marker.get("mode") != "explicit":
        raise invalid(f"{param}.prompt_cache_breakpoint", "must be {'mode': 'explicit'}")
    out["prompt_cache_breakpoint"] = {"mode": "explicit"}


def _normalize_reasoning(
    param: str, item: Mapping[str, Any], item_id: str | None, seal: ReasoningSeal | None
) -> dict[str, Any]:
    content = item.get("content")
    encrypted = item.get("encrypted_content")
    if encrypted is not None and not isinstance(encrypted, str):
        raise invalid_type(f"{param}.encrypted_content", "a string", encrypted)
    if content is None and encrypted is not None:
        # Replayed as summary + encrypted_content (Codex): ours opens to the raw reasoning;
        # anything else is omitted reasoning, exactly as if the client had left the Item out.
        text = seal.open(encrypted) if seal is not None else None
        if text is not None:
            content = [{"type": "reasoning_text", "text": text}]
    elif content is None:
        raise unsupported(
            f"{param}.content",
            "reasoning replay needs raw reasoning_text content or this server's "
            "encrypted_content; a summary alone cannot reconstruct the model's reasoning",
        )
    if content is None:
        return _reasoning_item(item_id, item.get("summary", []), None, encrypted, param)
    if not isinstance(content, list):
        raise invalid_type(f"{param}.content", "an array of reasoning_text parts", content)
    parts = []
    for i, part in enumerate(content):
        where = f"{param}.content[{i}]"
        if not isinstance(part, dict) or part.get("type") != "reasoning_text":
            raise invalid(where, "must be a reasoning_text part")
        if not isinstance(part.get("text"), str):
            raise invalid_type(f"{where}.text", "a string", part.get("text"))
        parts.append({"type": "reasoning_text", "text": part["text"]})
    return _reasoning_item(item_id, item.get("summary", []), parts, encrypted, param)


def _reasoning_item(
    item_id: str | None,
    summary: Any,
    parts: list[dict[str, Any]] | None,
    encrypted: str | None,
    param: str,
) -> dict[str, Any]:
    """`content` absent means omitted reasoning: kept in the history, never in the prompt."""
    if summary is None:
        summary = []
    if not isinstance(summary, list):
        raise invalid_type(f"{param}.summary", "an array", summary)
    out: dict[str, Any] = {
        "id": item_id or new_item_id("reasoning"),
        "type": "reasoning",
        "summary": summary,
    }
    if parts is not None:
        out["content"] = parts
    if encrypted is not None:
        out["encrypted_content"] = encrypted
    return out


def _completed_status(param: str, item: Mapping[str, Any]) -> None:
    status = item.get("status")
    if status not in (None, "completed"):
        raise unsupported(f"{param}.status", f"partial tool Items ({status!r}) are not supported")


def _opt_namespace(param: str, item: Mapping[str, Any]) -> str | None:
    namespace = item.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not namespace):
        raise invalid_type(f"{param}.namespace", "a non-empty string", namespace)
    return namespace


def _normalize_call(param: str, item: Mapping[str, Any], item_id: str | None) -> dict[str, Any]:
    _completed_status(param, item)
    call_id, name = item.get("call_id"), item.get("name")
    if not isinstance(call_id, str) or not call_id:
        raise _required(param, item, "call_id", "a non-empty string")
    if not isinstance(name, str) or not name:
        raise _required(param, item, "name", "a non-empty string")
    namespace = _opt_namespace(param, item)
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise _required(param, item, "arguments", "a JSON object string")
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        raise invalid(f"{param}.arguments", "is not valid JSON") from None
    if not isinstance(value, dict):
        raise invalid(f"{param}.arguments", "must encode a JSON object")
    out: dict[str, Any] = {
        "id": item_id or new_item_id("function_call"),
        "type": "function_call",
        "call_id": call_id,
        "name": name,
    }
    if namespace is not None:
        out["namespace"] = namespace
    out.update({"arguments": arguments, "status": "completed"})
    return out


def _normalize_custom_call(
    param: str, item: Mapping[str, Any], item_id: str | None
) -> dict[str, Any]:
    _completed_status(param, item)
    call_id, name, text = item.get("call_id"), item.get("name"), item.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise _required(param, item, "call_id", "a non-empty string")
    if not isinstance(name, str) or not name:
        raise _required(param, item, "name", "a non-empty string")
    if not isinstance(text, str):
        raise _required(param, item, "input", "a string")
    return {
        "id": item_id or new_item_id("custom_tool_call"),
        "type": "custom_tool_call",
        "status": "completed",
        "call_id": call_id,
        "name": name,
        "input": text,
    }


def _normalize_shell_call(
    param: str, item: Mapping[str, Any], item_id: str | None
) -> dict[str, Any]:
    _completed_status(param, item)
    call_id = item.get("call_id") or item_id  # Chat-era Codex items carried only an id
    if not isinstance(call_id, str) or not call_id:
        raise _required(param, item, "call_id", "a non-empty string")
    action = shell_action(item.get("action"))
    if action is None:
        raise invalid(
            f"{param}.action",
            "must be {type: 'exec', command: [strings], timeout_ms?, working_directory?, env?, "
            "user?}",
        )
    return {
        "id": item_id or new_item_id("local_shell_call"),
        "type": "local_shell_call",
        "status": "completed",
        "call_id": call_id,
        "action": action,
    }


def shell_action(raw: Any) -> dict[str, Any] | None:
    """A local_shell `exec` action in its canonical form, or None when it is not one."""
    if not isinstance(raw, dict) or raw.get("type", "exec") != "exec":
        return None
    command = raw.get("command")
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(arg, str) for arg in command)
    ):
        return None
    action: dict[str, Any] = {"type": "exec", "command": list(command)}
    checks = {
        "timeout_ms": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "working_directory": lambda v: isinstance(v, str),
        "env": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
        "user": lambda v: isinstance(v, str),
    }
    for name, ok in checks.items():
        value = raw.get(name)
        if value is not None and not ok(value):
            return None
        action[name] = value
    unknown = set(raw) - set(checks) - {"type", "command"}
    return None if unknown else action


def _normalize_output(
    param: str, item: Mapping[str, Any], item_id: str | None, kind: str
) -> dict[str, Any]:
    _completed_status(param, item)
    call_id = item.get("call_id")
    if kind == "local_shell_call_output" and call_id is None:
        call_id, item_id = item_id, None  # the API names the answered call by `id`
    if not isinstance(call_id, str) or not call_id:
        raise _required(param, item, "call_id", "a non-empty string")
    output = item.get("output")
    if isinstance(output, list):
        if not output:
            raise invalid(f"{param}.output", "must be a string or a non-empty array of parts")
        output = [_normalize_result_part(f"{param}.output[{i}]", p) for i, p in enumerate(output)]
    elif not isinstance(output, str):
        raise _required(param, item, "output", "a string or an array of content parts")
    out: dict[str, Any] = {
        "id": item_id or new_item_id(kind),
        "type": kind,
        "call_id": call_id,
        "output": output,
    }
    name = item.get("name")
    if name is not None:
        if not isinstance(name, str) or not name:
            raise invalid_type(f"{param}.name", "a non-empty string", name)
        out["name"] = name
    namespace = _opt_namespace(param, item)
    if namespace is not None:
        out["namespace"] = namespace
    out["status"] = "completed"
    return out


def _normalize_result_part(param: str, part: Any) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "input_text":
        text = part.get("text")
        if not isinstance(text, str):
            raise invalid_type(f"{param}.text", "a string", text)
        out = {"type": "input_text", "text": text}
        _copy_breakpoint(param, part, out)
        return out
    if kind == "input_image":
        return _media_part(param, kind, part)
    if not isinstance(kind, str):
        raise invalid(param, "must be a content part object with a type")
    raise unsupported(f"{param}.type", f"tool result part type {kind!r} is not supported")


def _media_part(param: str, kind: str, part: Mapping[str, Any]) -> dict[str, Any]:
    """Canonical input_image / input_video: the URL string (data URI or http(s)), no detail."""
    key = "image_url" if kind == "input_image" else "video_url"
    if part.get("file_id") is not None:
        raise unsupported(f"{param}.file_id", "file ids are not supported; send the media URL")
    check_detail(f"{param}.detail", part.get("detail"))
    out: dict[str, Any] = {"type": kind, key: media_url(f"{param}.{key}", part.get(key))}
    _copy_breakpoint(param, part, out)
    return out


def _required(param: str, item: Mapping[str, Any], name: str, expected: str) -> ProtocolError:
    if item.get(name) is None:
        return invalid(f"{param}.{name}", "is required", code="missing_required_parameter")
    return invalid_type(f"{param}.{name}", expected, item[name])


# ---------------------------------------------------------------------------------------------
# Lowering: Items -> template messages
# ---------------------------------------------------------------------------------------------


def has_user_message(items: list[dict[str, Any]]) -> bool:
    return any(i["type"] == "message" and i["role"] == "user" for i in items)


@dataclass
class _AssistantTurn:
    stage: int = -1
    reasoning: list[str] | None = None
    content: list[dict[str, Any]] = field(default_factory=list)  # template parts
    calls: list[dict[str, Any]] = field(default_factory=list)  # the function_call Items


def lower_items(
    items: list[dict[str, Any]],
    tool_name: ToolNamer,
    *,
    num_history: int = 0,
    param: str = "input",
    marks: list[tuple[int, int]] | None = None,
) -> list[dict[str, Any]]:
    """Template messages for canonical Items; the first `num_history` came from stored Responses.

    `marks` receives each prompt_cache_breakpoint of a message or tool-result part as (message
    index, characters of that message's content up to the part's end).

    Raises `invalid_assistant_history` for assistant Items in an order one turn cannot represent
    and `invalid_tool_history` for results that do not answer exactly the preceding turn's calls.
    """

    def where(i: int) -> str:
        return f"{param}[{i - num_history}]" if i >= num_history else "previous_response_id"

    messages: list[dict[str, Any]] = []
    turn: _AssistantTurn | None = None
    last_calls: list[dict[str, Any]] = []  # calls of the turn the next results may answer
    seen_call_ids: set[str] = set()
    i = 0
    while i < len(items):
        item = items[i]
        kind = item["type"]
        stage = _STAGE.get(kind) if kind != "message" or item["role"] == "assistant" else None
        if stage is not None:
            turn = turn or _AssistantTurn()
            if stage < turn.stage:
                raise ProtocolError(
                    f"{where(i)}: a {kind} Item cannot follow "
                    f"{'a function_call' if turn.stage == 2 else 'assistant message content'} "
                    "in one assistant turn (order: reasoning, message, function_call)",
                    code="invalid_assistant_history",
                    param=where(i),
                )
            turn.stage = stage
            _add_to_turn(turn, item, where(i), seen_call_ids)
            i += 1
            continue
        if turn is not None:
            messages.append(_assistant_message(turn, tool_name))
            last_calls, turn = turn.calls, None
        if kind in _RESULTS:
            end = i
            while end < len(items) and items[end]["type"] in _RESULTS:
                end += 1
            results = _tool_results(items[i:end], last_calls, [where(j) for j in range(i, end)])
            for result in results:
                _marks_of(result.pop("_parts"), len(messages), marks)
                messages.append(result)
            last_calls = []
            i = end
            continue
        _marks_of(item["content"], len(messages), marks)
        content = joined(_parts(item["content"], f"{where(i)}.content"))
        messages.append({"role": item["role"], "content": content})
        last_calls = []
        i += 1
    if turn is not None:
        messages.append(_assistant_message(turn, tool_name))
    return messages


def _add_to_turn(turn: _AssistantTurn, item: dict[str, Any], where: str, seen: set[str]) -> None:
    if item["type"] == "reasoning":
        if "content" in item:  # omitted reasoning (unopened encrypted_content) adds nothing
            turn.reasoning = (turn.reasoning or []) + [p["text"] for p in item["content"]]
    elif item["type"] == "message":
        turn.content += _parts(item["content"], f"{where}.content")
    else:
        if item["call_id"] in seen:
            raise ProtocolError(
                f"{where}.call_id: call_id {item['call_id']!r} is used by an earlier function_call",
                code="invalid_tool_history",
                param=f"{where}.call_id",
            )
        seen.add(item["call_id"])
        turn.calls.append(item)


def _assistant_message(turn: _AssistantTurn, tool_name: ToolNamer) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": joined(turn.content)}
    if turn.reasoning is not None:
        out["reasoning_content"] = "".join(turn.reasoning)
    if turn.calls:
        out["tool_calls"] = [
            {"id": call["call_id"], "type": "function", "function": _call_function(call, tool_name)}
            for call in turn.calls
        ]
    return out


def _call_function(call: dict[str, Any], tool_name: ToolNamer) -> dict[str, Any]:
    """How the model wrote the call: custom tools take one `input` string, local_shell its
    action's fields (the shapes their tool definitions offered)."""
    if call["type"] == "custom_tool_call":
        name = tool_name(None, call["name"])
        arguments = json.dumps({"input": call["input"]}, ensure_ascii=False)
    elif call["type"] == "local_shell_call":
        name = LOCAL_SHELL
        fields = {k: v for k, v in call["action"].items() if k != "type" and v is not None}
        arguments = json.dumps(fields, ensure_ascii=False)
    else:
        name = tool_name(call.get("namespace"), call["name"])
        arguments = call["arguments"]
    return {"name": name, "arguments": arguments}


def _tool_results(
    results: list[dict[str, Any]], calls: list[dict[str, Any]], wheres: list[str]
) -> list[dict[str, Any]]:
    """Tool messages in call declaration order; the results must answer every call exactly once."""
    by_id = {call["call_id"]: call for call in calls}
    matched: dict[str, dict[str, Any]] = {}
    for result, where in zip(results, wheres, strict=True):
        call_id = result["call_id"]
        call = by_id.get(call_id)
        if call is None:
            raise _tool_history(
                where, f"call_id {call_id!r} answers no tool call of the preceding turn"
            )
        if call_id in matched:
            raise _tool_history(where, f"call_id {call_id!r} has more than one result")
        for key in ("name", "namespace"):
            if key in result and result[key] != call.get(key):
                raise _tool_history(
                    where, f"{key} {result[key]!r} does not match the call's {call.get(key)!r}"
                )
        matched[call_id] = result
    missing = [call_id for call_id in by_id if call_id not in matched]
    if missing:
        raise _tool_history(
            wheres[-1],
            f"results for call_id(s) {', '.join(map(repr, missing))} are missing; a partial "
            "result set cannot be represented",
        )
    where_of = {r["call_id"]: w for r, w in zip(results, wheres, strict=True)}
    return [
        {
            "role": "tool",
            "tool_call_id": call_id,
            "content": _result_text(matched[call_id], where_of[call_id]),
            "_parts": _result_parts(matched[call_id]),
        }
        for call_id in by_id
    ]


def _tool_history(where: str, message: str) -> ProtocolError:
    return ProtocolError(f"{where}: {message}", code="invalid_tool_history", param=where)


def _parts(content: list[Mapping[str, Any]], param: str) -> list[dict[str, Any]]:
    """Canonical parts -> template parts; a refusal's text enters assistant history as content.
    Text-only content later joins without separators (`joined`)."""
    out = []
    for j, p in enumerate(content):
        if p["type"] == "refusal":
            out.append(text_part(p["refusal"]))
        elif p["type"] == "input_image":
            out.append(template_part("image", p["image_url"], f"{param}[{j}]"))
        elif p["type"] == "input_video":
            out.append(template_part("video", p["video_url"], f"{param}[{j}]"))
        else:
            out.append(text_part(p["text"]))
    return out


def _result_text(result: Mapping[str, Any], where: str) -> str | list[dict[str, Any]]:
    output = result["output"]
    return output if isinstance(output, str) else joined(_parts(output, f"{where}.output"))


def _result_parts(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    output = result["output"]
    return [] if isinstance(output, str) else list(output)


def _marks_of(parts: list[dict[str, Any]], index: int, marks: list[tuple[int, int]] | None) -> None:
    """Breakpoints of one message's parts as (message index, text length up to the part)."""
    if marks is None:
        return
    length = 0
    for part in parts:
        length += len(part["refusal"] if part["type"] == "refusal" else part.get("text", ""))
        if part.get("prompt_cache_breakpoint") is not None:
            marks.append((index, length))
