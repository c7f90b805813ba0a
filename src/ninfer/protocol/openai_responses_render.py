"""OpenAI Responses rendering: model deltas -> output Items, the Response object and its SSE events.

Standard library and `protocol` only. One `OutputBuilder` serves both modes: it turns reasoning,
content and tool-call deltas into output Items and, for each, the semantic stream events, so an
aggregate body is by construction the terminal state of the stream (same ids, indices and text).
"""

from __future__ import annotations

import enum
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ninfer.protocol.openai_responses_items import new_item_id, shell_action

Identity = Callable[[str], tuple[str | None, str]]  # engine tool name -> (namespace, name)
ToolKind = Callable[[str], str]  # engine tool name -> "function" | "custom" | "local_shell"
Sealer = Callable[[str], str]  # raw reasoning text -> encrypted_content
CALL_TYPES = ("function_call", "custom_tool_call", "local_shell_call")


class ResponseStatus(enum.StrEnum):
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"
    INCOMPLETE = "incomplete"
    FAILED = "failed"


def new_response_id() -> str:
    return "resp_" + uuid.uuid4().hex


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True)
class ResponseUsage:
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


def status_for(finish_reason: str) -> ResponseStatus:
    """Output-token or context exhaustion is `incomplete`; every ordinary stop is `completed`."""
    if finish_reason in ("length", "context"):
        return ResponseStatus.INCOMPLETE
    return ResponseStatus.COMPLETED


class OutputBuilder:
    """Output Items of one Response and the stream events that build them, in order.

    Every method returns the events (without `sequence_number`; `EventSequencer` numbers them).
    A change of channel closes the open Item, so each Item's deltas concatenate to its text.
    """

    def __init__(
        self, identity: Identity, *, kind: ToolKind | None = None, seal: Sealer | None = None
    ) -> None:
        self.identity = identity
        self.kind = kind or (lambda name: "function")
        self.seal = seal  # set when the request includes reasoning.encrypted_content
        self.output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the reasoning or message Item being written
        self._text: list[str] = []

    @property
    def has_tool_calls(self) -> bool:
        return any(item["type"] in CALL_TYPES for item in self.output)

    def reasoning(self, text: str) -> list[dict[str, Any]]:
        return self._delta("reasoning", text)

    def content(self, text: str) -> list[dict[str, Any]]:
        return self._delta("message", text)

    def _delta(self, kind: str, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        events = []
        if self._open is None or self._open["type"] != kind:
            events += self._close(ResponseStatus.COMPLETED)
            events += self._start(kind)
        self._text.append(text)
        item = self._open
        assert item is not None
        name = "reasoning_text" if kind == "reasoning" else "output_text"
        event = {"type": f"response.{name}.delta", **self._where(item), "delta": text}
        if kind == "message":
            event["logprobs"] = []
        return events + [event]

    def _start(self, kind: str) -> list[dict[str, Any]]:
        if kind == "reasoning":
            item: dict[str, Any] = {
                "id": new_item_id("reasoning"),
                "type": "reasoning",
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
        else:
            item = {
                "id": new_item_id("message"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        self.output.append(item)
        self._open, self._text = item, []
        index = len(self.output) - 1
        return [
            {"type": "response.output_item.added", "output_index": index, "item": _copy(item)},
            {
                "type": "response.content_part.added",
                **self._where(item),
                "part": self._part(kind, ""),
            },
        ]

    @staticmethod
    def _part(kind: str, text: str) -> dict[str, Any]:
        if kind == "reasoning":
            return {"type": "reasoning_text", "text": text}
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def _where(self, item: dict[str, Any]) -> dict[str, Any]:
        index = next(i for i, x in enumerate(self.output) if x is item)
        return {"item_id": item["id"], "output_index": index, "content_index": 0}

    def _close(self, status: ResponseStatus) -> list[dict[str, Any]]:
        item = self._open
        if item is None:
            return []
        self._open = None
        kind, text = item["type"], "".join(self._text)
        part = self._part(kind, text)
        item["content"] = [part]
        item["status"] = status.value
        if kind == "reasoning" and self.seal is not None:
            item["encrypted_content"] = self.seal(text)
        where = self._where(item)
        name = "reasoning_text" if kind == "reasoning" else "output_text"
        done = {"type": f"response.{name}.done", **where, "text": text}
        if kind == "message":
            done["logprobs"] = []
        return [
            done,
            {"type": "response.content_part.done", **where, "part": dict(part)},
            {
                "type": "response.output_item.done",
                "output_index": where["output_index"],
                "item": _copy(item),
            },
        ]

    def tool_call(self, engine_name: str, arguments: str) -> list[dict[str, Any]]:
        """The Item for one parsed call: a function call, or the custom / local_shell call its
        tool's kind asks for (a call whose arguments do not fit that shape stays a function call,
        so nothing the model wrote is lost)."""
        events = self._close(ResponseStatus.COMPLETED)
        kind = self.kind(engine_name)
        args = _json_object(arguments) if kind != "function" else None
        if kind == "custom" and args is not None:
            text = _single_string(args)
            if text is not None:
                return events + self._custom_call(self.identity(engine_name)[1], text)
        if kind == "local_shell" and args is not None:
            action = shell_action({"type": "exec", **args})
            if action is not None:
                return events + self._shell_call(action)
        return events + self._function_call(engine_name, arguments)

    def _added(self, item: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
        self.output.append(item)
        index = len(self.output) - 1
        return index, [
            {"type": "response.output_item.added", "output_index": index, "item": _copy(item)}
        ]

    def _custom_call(self, name: str, text: str) -> list[dict[str, Any]]:
        item: dict[str, Any] = {
            "id": new_item_id("custom_tool_call"),
            "type": "custom_tool_call",
            "status": "in_progress",
            "call_id": new_call_id(),
            "name": name,
            "input": "",
        }
        index, events = self._added(item)
        where = {"item_id": item["id"], "output_index": index}
        if text:
            events.append({"type": "response.custom_tool_call_input.delta", **where, "delta": text})
        item["input"], item["status"] = text, "completed"
        events.append({"type": "response.custom_tool_call_input.done", **where, "input": text})
        events.append(
            {"type": "response.output_item.done", "output_index": index, "item": _copy(item)}
        )
        return events

    def _shell_call(self, action: dict[str, Any]) -> list[dict[str, Any]]:
        call_id = new_call_id()
        item: dict[str, Any] = {
            "id": new_item_id("local_shell_call"),
            "type": "local_shell_call",
            "status": "in_progress",
            "call_id": call_id,
            "action": action,
        }
        index, events = self._added(item)
        item["status"] = "completed"
        events.append(
            {"type": "response.output_item.done", "output_index": index, "item": _copy(item)}
        )
        return events

    def _function_call(self, engine_name: str, arguments: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        namespace, name = self.identity(engine_name)
        item: dict[str, Any] = {
            "id": new_item_id("function_call"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": new_call_id(),
            "name": name,
        }
        if namespace is not None:
            item["namespace"] = namespace
        item["arguments"] = ""
        self.output.append(item)
        index = len(self.output) - 1
        where = {"item_id": item["id"], "output_index": index}
        events.append(
            {"type": "response.output_item.added", "output_index": index, "item": _copy(item)}
        )
        if arguments:
            events.append(
                {"type": "response.function_call_arguments.delta", **where, "delta": arguments}
            )
        item["arguments"], item["status"] = arguments, "completed"
        events.append(
            {
                "type": "response.function_call_arguments.done",
                **where,
                "name": name,
                "arguments": arguments,
            }
        )
        events.append(
            {"type": "response.output_item.done", "output_index": index, "item": _copy(item)}
        )
        return events

    def finish(self, status: ResponseStatus) -> list[dict[str, Any]]:
        """Close the open Item; unless the Response completed, it stays `incomplete`."""
        done = status == ResponseStatus.COMPLETED
        return self._close(ResponseStatus.COMPLETED if done else ResponseStatus.INCOMPLETE)


class EventSequencer:
    """Numbers a Response's stream events: `sequence_number` rises by one from 0."""

    def __init__(self) -> None:
        self.next_number = 0

    def number(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for event in events:
            out.append({"type": event["type"], "sequence_number": self.next_number, **event})
            self.next_number += 1
        return out


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    """A snapshot: later mutation of the builder's Item must not change emitted events."""
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(p) for p in out["content"]]
    if "action" in out:
        out["action"] = json.loads(json.dumps(out["action"]))
    return out


def _json_object(arguments: str) -> dict[str, Any] | None:
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _single_string(args: dict[str, Any]) -> str | None:
    """A custom tool's raw input: its `input` string, or the one string the model wrote."""
    value = args.get("input")
    if isinstance(value, str):
        return value
    if len(args) == 1:
        (only,) = args.values()
        if isinstance(only, str):
            return only
    return None


def response_object(
    *,
    response_id: str,
    created_at: int,
    model: str,
    status: ResponseStatus,
    output: list[dict[str, Any]],
    request: Any,
    usage: ResponseUsage | None,
    completed_at: int | None = None,
    error: dict[str, Any] | None = None,
    reasoning_effort: str | None = None,
) -> dict[str, Any]:
    """The wire Response; `request` is the parsed `ResponsesRequest` whose settings it echoes."""
    echo = request.echo
    incomplete = {"reason": "max_output_tokens"} if status == ResponseStatus.INCOMPLETE else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status.value,
        "completed_at": completed_at if status == ResponseStatus.COMPLETED else None,
        "background": False,
        "error": error,
        "incomplete_details": incomplete,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": request.max_tool_calls,
        "model": model,
        "output": [_copy(item) for item in output],
        "parallel_tool_calls": request.parallel_tool_calls,
        "previous_response_id": request.previous_response_id,
        "prompt_cache_key": echo.get("prompt_cache_key"),
        "prompt_cache_retention": echo.get("prompt_cache_retention"),
        "reasoning": {"effort": reasoning_effort, "summary": None},
        "safety_identifier": echo.get("safety_identifier"),
        "service_tier": "default",
        "store": request.store,
        "temperature": request.sampling.get("temperature"),
        "text": {"format": {"type": "text"}, "verbosity": echo.get("verbosity") or "medium"},
        "tool_choice": request.tool_choice,
        "tools": request.tools.declared,
        "top_logprobs": 0,
        "top_p": request.sampling.get("top_p"),
        "truncation": "disabled",
        "usage": None if usage is None else usage.to_dict(),
        "user": echo.get("user"),
        "metadata": request.metadata or {},
    }
