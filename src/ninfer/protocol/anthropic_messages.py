"""Anthropic Messages history lowering: system + messages -> template-ready messages.

Imports the standard library and `protocol.errors` only. Owns the spec's history rules (billing
header, joined turns, in-place system, tool_result ordering, prefill) and cache_control: checked,
counted, and located as (message index, characters of its content) for the prefix cache (a
marker on the tool list is message TOOLS_MARK). Rejections name the field.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ninfer.protocol.errors import ProtocolError, invalid, invalid_type, unsupported
from ninfer.protocol.media_parts import joined, media_url, template_part, text_length, text_part

BILLING_HEADER_PREFIX = "x-anthropic-billing-header:"
MAX_CACHE_BREAKPOINTS = 4
CACHE_TTLS = ("5m", "1h")
TOOLS_MARK = -1  # a cache position "after the tool declarations"
Position = tuple[int, int | None]  # (message index, characters of its content; None: all)
TOOL_ERROR_MARK = "[is_error: true]\n"  # how a failed tool result reads in the model prompt
# Blocks whose execution or content ninfer cannot provide, by where they may appear.
_EXECUTION_BLOCKS = frozenset(
    {
        "document",
        "search_result",
        "container_upload",
        "server_tool_use",
        "web_search_tool_result",
        "web_fetch_tool_result",
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
        "mcp_tool_use",
        "mcp_tool_result",
    }
)


# Anthropic's image media types (base64 sources)
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def image_part(param: str, block: dict[str, Any]) -> dict[str, str]:
    """An image block's source as a template image part (base64 -> data URI, or the URL)."""
    source = block.get("source")
    if not isinstance(source, dict):
        raise invalid_type(f"{param}.source", "an object", source)
    kind = source.get("type")
    if kind == "base64":
        media_type = source.get("media_type")
        if media_type not in IMAGE_MEDIA_TYPES:
            raise invalid(
                f"{param}.source.media_type",
                f"must be one of {', '.join(IMAGE_MEDIA_TYPES)}, got {media_type!r}",
                code="invalid_media",
            )
        data = source.get("data")
        if not isinstance(data, str) or not data:
            raise invalid_type(f"{param}.source.data", "a non-empty base64 string", data)
        return template_part("image", f"data:{media_type};base64,{data}", param)
    if kind == "url":
        url = media_url(f"{param}.source.url", source.get("url"))
        return template_part("image", url, param)
    if kind == "file":
        raise unsupported(f"{param}.source.type", "file sources need the Files API; send the bytes")
    raise invalid(f"{param}.source.type", f"must be base64 or url, got {kind!r}")


@dataclass
class CacheMarks:
    """Block-level cache_control markers in prompt order (tools, system, messages).

    Lowering reports each cacheable block with where it ends (`at`: a locator the lowering
    function resolves to a `Position` once its messages are placed, or None when the boundary
    is not a content position, e.g. after a tool_use block).
    """

    ttls: list[str] = field(default_factory=list)  # one per explicit breakpoint
    last_block_ttl: str | None = None  # the marker on the last cacheable block, if any
    num_blocks: int = 0
    positions: list[Position] = field(default_factory=list)  # explicit breakpoints, resolved
    last_position: Position | None = None  # where the last cacheable block ends
    base: int = 0  # the index the next lowered message will have
    _open: list[tuple[bool, Any]] = field(default_factory=list)

    def block(self, param: str, block: dict[str, Any], at: Any = None) -> None:
        """Record one cacheable block and its optional marker."""
        self.num_blocks += 1
        self.last_block_ttl = None
        raw = block.get("cache_control")
        self._open.append((raw is not None, at))
        if raw is None:
            return
        ttl = cache_ttl(f"{param}.cache_control", raw)
        self.ttls.append(ttl)
        self.last_block_ttl = ttl
        if len(self.ttls) > MAX_CACHE_BREAKPOINTS:
            raise invalid(
                f"{param}.cache_control",
                f"at most {MAX_CACHE_BREAKPOINTS} blocks may carry cache_control",
                code="too_many_cache_breakpoints",
            )

    def resolve(self, where: Callable[[Any], Position | None]) -> None:
        """Place the blocks recorded since the last call (their messages now have indices)."""
        for marked, at in self._open:
            position = where(at) if at is not None else None
            self.last_position = position
            if marked and position is not None:
                self.positions.append(position)
        self._open = []

    def request_level(self, raw: Any) -> None:
        """Request-level cache_control targets the last cacheable block (spec: merge/conflict)."""
        if raw is None:
            return
        ttl = cache_ttl("cache_control", raw)
        if self.num_blocks == 0:
            return  # nothing cacheable: a legal, unrepresentable hint
        if self.last_block_ttl is not None:
            if self.last_block_ttl != ttl:
                raise invalid(
                    "cache_control",
                    f"ttl {ttl!r} conflicts with the explicit {self.last_block_ttl!r} "
                    "breakpoint on the last cacheable block",
                    code="conflicting_cache_control",
                )
            return  # merges with the explicit breakpoint at the same target
        if len(self.ttls) >= MAX_CACHE_BREAKPOINTS:
            raise invalid(
                "cache_control",
                f"{MAX_CACHE_BREAKPOINTS} explicit breakpoints leave no slot for the "
                "request-level breakpoint",
                code="too_many_cache_breakpoints",
            )
        if self.last_position is not None:
            self.positions.append(self.last_position)


def cache_ttl(param: str, raw: Any) -> str:
    if not isinstance(raw, dict):
        raise invalid_type(param, "an object", raw)
    if raw.get("type") != "ephemeral":
        raise invalid(f"{param}.type", f"must be 'ephemeral', got {raw.get('type')!r}")
    ttl = raw.get("ttl", "5m")
    if ttl not in CACHE_TTLS:
        raise invalid(f"{param}.ttl", f"must be '5m' or '1h', got {ttl!r}")
    return ttl


@dataclass(frozen=True)
class History:
    """Template-ready messages; `prefill` is True when the last one is an open assistant turn."""

    messages: list[dict[str, Any]]
    prefill: bool


# -- system --------------------------------------------------------------------------------------


def lower_system(system: Any, marks: CacheMarks) -> list[dict[str, Any]]:
    """The top-level system value as zero or one system message."""
    if system is None:
        return []
    if isinstance(system, str):  # no marker of its own, but later messages' indices move
        if not system:
            return []
        marks.base += 1
        return [{"role": "system", "content": system}]
    if not isinstance(system, list):
        raise invalid_type("system", "a string or an array of text blocks", system)
    texts = []
    length = 0
    for i, block in enumerate(system):
        param = f"system[{i}]"
        text = _text_block(param, block)
        if i == 0 and text.startswith(BILLING_HEADER_PREFIX):
            continue  # Claude Code attribution: consumed whole, its cache_control with it
        length += len(text)
        marks.block(param, block, at=length)
        texts.append(text)
    index = marks.base
    marks.resolve(lambda at: (index, at))
    if texts:
        marks.base += 1
    return [{"role": "system", "content": "".join(texts)}] if texts else []


def _text_block(param: str, block: Any) -> str:
    if not isinstance(block, dict):
        raise invalid_type(param, "a content block object", block)
    if block.get("type") != "text":
        raise invalid(f"{param}.type", f"must be 'text', got {block.get('type')!r}")
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid_type(f"{param}.text", "a string", text)
    return text


# -- messages ------------------------------------------------------------------------------------


@dataclass
class _Turn:
    role: str
    param: str  # the first source message, for error messages
    blocks: list[tuple[str, dict[str, Any]]]  # (param, block) in order


def lower_messages(messages: Any, marks: CacheMarks) -> History:
    if messages is None:
        raise invalid("messages", "is required", code="missing_required_parameter")
    if not isinstance(messages, list):
        raise invalid_type("messages", "an array", messages)
    if not messages:
        raise invalid("messages", "must contain at least one message")
    turns = list(_joined_turns(messages))
    out: list[dict[str, Any]] = []
    pending: tuple[str, list[str]] | None = None  # (assistant param, tool_use ids) to answer
    first_index = marks.base
    for n, turn in enumerate(turns):
        marks.base = first_index + len(out)
        if turn.role == "user":
            out += _lower_user(turn, pending, first=n == 0, marks=marks)
            pending = None
            continue
        if pending is not None:
            raise _missing_results(pending, turn.param)
        index = marks.base
        if turn.role == "system":
            out.append(
                {"role": "system", "content": _plain_text(turn, marks, what="system messages")}
            )
        else:
            message, ids = _lower_assistant(turn, marks)
            out.append(message)
            pending = (turn.param, ids) if ids else None
        marks.resolve(lambda at, index=index: (index, at))
    marks.base = first_index + len(out)
    last = turns[-1]
    prefill = last.role == "assistant"
    if prefill:
        _check_prefill(last, out[-1])
    return History(out, prefill)


def _joined_turns(messages: list[Any]) -> Iterator[_Turn]:
    """Consecutive messages of one role become one turn; blocks keep their order."""
    turn: _Turn | None = None
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid_type(param, "an object", message)
        role = message.get("role")
        if role not in ("user", "assistant", "system"):
            raise invalid(f"{param}.role", f"must be user, assistant or system, got {role!r}")
        blocks = _blocks(f"{param}.content", message.get("content"))
        if turn is not None and turn.role == role and role != "system":
            turn.blocks += blocks
            continue
        if turn is not None:
            yield turn
        turn = _Turn(role, param, blocks)
    assert turn is not None
    yield turn


def _blocks(param: str, content: Any) -> list[tuple[str, dict[str, Any]]]:
    if isinstance(content, str):
        return [(param, {"type": "text", "text": content})]
    if not isinstance(content, list):
        raise invalid_type(param, "a string or an array of content blocks", content)
    out = []
    for i, block in enumerate(content):
        where = f"{param}[{i}]"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise invalid(where, "must be a content block object with a type")
        out.append((where, block))
    return out


def _reject_block(param: str, kind: str, where: str) -> ProtocolError:
    if kind in _EXECUTION_BLOCKS:
        return unsupported(
            f"{param}.type",
            f"{kind} blocks need an executor or store ninfer does not have",
            "unsupported_content",
        )
    if kind in ("text", "image", "thinking", "redacted_thinking", "tool_use", "tool_result"):
        return unsupported(f"{param}.type", f"{kind} blocks are not allowed in {where}")
    return invalid(f"{param}.type", f"unknown content block type {kind!r}")


def _text(param: str, block: dict[str, Any]) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid_type(f"{param}.text", "a string", text)
    return text


def _plain_text(turn: _Turn, marks: CacheMarks, *, what: str) -> str:
    texts = []
    for param, block in turn.blocks:
        if block["type"] != "text":
            raise _reject_block(param, block["type"], what)
        texts.append(_text(param, block))
        marks.block(param, block, at=sum(map(len, texts)))
    return "".join(texts)


def _lower_user(
    turn: _Turn, pending: tuple[str, list[str]] | None, *, first: bool, marks: CacheMarks
) -> list[dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    parts: list[dict[str, str]] = []
    for param, block in turn.blocks:
        kind = block["type"]
        if kind == "tool_result":
            if parts:
                raise invalid(param, "tool_result blocks must come before any other block")
            tool_use_id = block.get("tool_use_id")
            if not isinstance(tool_use_id, str) or not tool_use_id:
                raise invalid_type(f"{param}.tool_use_id", "a non-empty string", tool_use_id)
            if tool_use_id in results:
                raise invalid(f"{param}.tool_use_id", f"duplicate result for {tool_use_id!r}")
            results[tool_use_id] = _tool_message(param, block, tool_use_id)
            order.append(tool_use_id)
            marks.block(param, block, at=tool_use_id)
        elif kind == "text":
            parts.append(text_part(_text(param, block)))
            marks.block(param, block, at=text_length(parts))
        elif kind == "image":
            parts.append(image_part(param, block))
            marks.block(param, block, at=text_length(parts))
        else:
            raise _reject_block(param, kind, "user messages")
    if pending is not None:
        source, ids = pending
        missing = [i for i in ids if i not in results]
        extra = [i for i in order if i not in ids]
        if missing or extra:
            raise invalid(
                turn.param,
                f"the user turn after the tool_use turn {source} must lead with exactly one "
                f"tool_result per tool_use id (missing {missing}, unknown {extra})",
                code="invalid_tool_result_order",
            )
        order = ids  # normalized to call order
    elif results and not first:
        raise invalid(
            turn.param,
            "tool_result blocks must answer the tool_use blocks of the preceding assistant turn",
            code="invalid_tool_result_order",
        )
    out = [results[i] for i in order]
    base = marks.base

    def where(at: Any) -> Position:
        if isinstance(at, str):  # a tool result: the end of its tool message
            return (base + order.index(at), None)
        return (base + len(out), at)

    marks.resolve(where)
    if parts or not out:
        out.append({"role": "user", "content": joined(parts)})
    return out


def _tool_message(param: str, block: dict[str, Any], tool_use_id: str) -> dict[str, Any]:
    content = block.get("content")
    parts: list[dict[str, str]] = []
    if isinstance(content, str):
        parts.append(text_part(content))
    elif isinstance(content, list):
        for where, part in _blocks(f"{param}.content", content):
            if part["type"] == "text":
                parts.append(text_part(_text(where, part)))
            elif part["type"] == "image":  # screenshots in tool results keep their place
                parts.append(image_part(where, part))
            else:
                raise _reject_block(where, part["type"], "tool_result content")
    elif content is not None:
        raise invalid_type(f"{param}.content", "a string or an array of blocks", content)
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise invalid_type(f"{param}.is_error", "a boolean", is_error)
    if is_error:
        parts.insert(0, text_part(TOOL_ERROR_MARK))
    return {"role": "tool", "tool_call_id": tool_use_id, "content": joined(parts)}


def _lower_assistant(turn: _Turn, marks: CacheMarks) -> tuple[dict[str, Any], list[str]]:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for param, block in turn.blocks:
        kind = block["type"]
        if kind == "text":
            texts.append(_text(param, block))
            marks.block(param, block, at=sum(map(len, texts)))
        elif kind == "thinking":
            thinking = block.get("thinking")
            if not isinstance(thinking, str):
                raise invalid_type(f"{param}.thinking", "a string", thinking)
            signature = block.get("signature")
            if signature is not None and not isinstance(signature, str):
                raise invalid_type(f"{param}.signature", "a string", signature)
            reasoning.append(thinking)  # the signature is transport metadata only
        elif kind == "redacted_thinking":
            raise unsupported(
                f"{param}.type",
                "redacted thinking cannot be restored: ninfer has no encrypted reasoning",
            )
        elif kind == "tool_use":
            calls.append(_tool_use(param, block, [c["id"] for c in calls]))
            # NOTE: the end of a tool call is not a content position: a marker here counts as a
            # breakpoint but is not placed (a legal, unrepresentable boundary)
            marks.block(param, block)
        else:
            raise _reject_block(param, kind, "assistant messages")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message, [c["id"] for c in calls]


def _tool_use(param: str, block: dict[str, Any], seen: list[str]) -> dict[str, Any]:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not call_id:
        raise invalid_type(f"{param}.id", "a non-empty string", call_id)
    if call_id in seen:
        raise invalid(f"{param}.id", f"duplicate tool_use id {call_id!r}")
    if not isinstance(name, str) or not name:
        raise invalid_type(f"{param}.name", "a non-empty string", name)
    if not isinstance(arguments, dict):
        raise invalid_type(f"{param}.input", "an object", arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _missing_results(pending: tuple[str, list[str]], param: str) -> ProtocolError:
    return invalid(
        param,
        f"the tool_use turn {pending[0]} must be followed by a user turn with its tool_result "
        "blocks",
        code="invalid_tool_result_order",
    )


def _check_prefill(turn: _Turn, message: dict[str, Any]) -> None:
    """A final assistant message continues as text only (spec: prefill restrictions)."""
    for param, block in turn.blocks:
        if block["type"] != "text":
            raise unsupported(
                f"{param}.type",
                f"an assistant prefill may contain text only, not {block['type']} blocks",
                "invalid_prefill",
            )
    content = message["content"]
    if content != content.rstrip():
        raise invalid(
            f"{turn.param}.content",
            "the final assistant content cannot end with whitespace",
            code="invalid_prefill",
        )
