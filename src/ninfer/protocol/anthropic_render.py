"""Anthropic Messages rendering: output deltas -> content blocks, message bodies and SSE events.

Imports the standard library and `chat.output_decoder` (ToolCall) only. One `BlockAssembler`
drives both forms: it turns reasoning / content / tool-call deltas into the block lifecycle of
the SSE stream and keeps the same blocks for the aggregate body, so the two cannot disagree.
SSE events are (name, data) pairs; framing is the server's job.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from ninfer.chat.output_decoder import ToolCall
from ninfer.protocol.errors import ProtocolError

Event = tuple[str, dict[str, Any]]  # (SSE event name, data object)

# HTTP status -> Anthropic error type (their documented categories).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def new_message_id() -> str:
    return "msg_" + uuid.uuid4().hex[:24]


def new_tool_use_id() -> str:
    return "toolu_" + uuid.uuid4().hex[:24]


def thinking_signature(thinking: str) -> str:
    """An opaque, deterministic compatibility signature; request lowering ignores it."""
    digest = hashlib.sha256(b"ninfer-thinking-v1\0" + thinking.encode()).digest()
    return base64.b64encode(b"ninfer1" + digest[:24]).decode()


def stop_reason(finish: str, *, stop_sequence: str | None, has_tool_use: bool) -> str:
    """Anthropic stop_reason from the engine's finish reason value."""
    if finish == "length":
        return "max_tokens"
    if finish == "context":
        return "model_context_window_exceeded"
    if stop_sequence is not None:
        return "stop_sequence"
    return "tool_use" if has_tool_use else "end_turn"


@dataclass(frozen=True)
class MessageUsage:
    # Anthropic's split of the prompt, three disjoint counts that add up to it: the tokens read
    # from the cache, those past them up to the last cache_control marker (written there for
    # later requests), and the rest
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int | None = None  # None: not known

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "output_tokens": self.output_tokens,
        }


def error_body(error: ProtocolError, request_id: str) -> dict[str, Any]:
    """Anthropic's error envelope; `code` and `param` are ninfer's field-specific extensions."""
    kind = ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else None)
    if kind is None:
        kind = "invalid_request_error"
    return {
        "type": "error",
        "error": {"type": kind, "message": error.message, "code": error.code, "param": error.param},
        "request_id": request_id,
    }


class BlockAssembler:
    """Content blocks of one message, built from deltas in order, with their SSE events."""

    def __init__(self) -> None:
        self.blocks: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None

    @property
    def has_tool_use(self) -> bool:
        return any(b["type"] == "tool_use" for b in self.blocks)

    def thinking(self, text: str) -> list[Event]:
        return self._text_delta("thinking", text)

    def text(self, text: str) -> list[Event]:
        return self._text_delta("text", text)

    def tool_use(self, call: ToolCall) -> list[Event]:
        out = self.close()
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        block = {"type": "tool_use", "id": new_tool_use_id(), "name": call.name, "input": arguments}
        index = len(self.blocks)
        self.blocks.append(block)
        start = {**block, "input": {}}
        out.append(_event("content_block_start", index=index, content_block=start))
        if arguments:
            delta = {"type": "input_json_delta", "partial_json": call.arguments}
            out.append(_event("content_block_delta", index=index, delta=delta))
        out.append(_event("content_block_stop", index=index))
        return out

    def close(self) -> list[Event]:
        """Close the open text or thinking block (a thinking block gets its signature first)."""
        block, self._open = self._open, None
        if block is None:
            return []
        index = len(self.blocks) - 1
        out = []
        if block["type"] == "thinking":
            block["signature"] = thinking_signature(block["thinking"])
            delta = {"type": "signature_delta", "signature": block["signature"]}
            out.append(_event("content_block_delta", index=index, delta=delta))
        out.append(_event("content_block_stop", index=index))
        return out

    def _text_delta(self, kind: str, text: str) -> list[Event]:
        if not text:
            return []
        out: list[Event] = []
        if self._open is None or self._open["type"] != kind:
            out += self.close()
            self._open = {"type": kind, kind: ""}
            if kind == "thinking":
                self._open["signature"] = ""
            self.blocks.append(self._open)
            start = dict(self._open)
            out.append(
                _event("content_block_start", index=len(self.blocks) - 1, content_block=start)
            )
        self._open[kind] += text
        delta_type = "thinking_delta" if kind == "thinking" else "text_delta"
        delta = {"type": delta_type, kind: text}
        out.append(_event("content_block_delta", index=len(self.blocks) - 1, delta=delta))
        return out


@dataclass(frozen=True)
class MessageRenderer:
    """The message-level objects of one response (aggregate body, start/delta/stop events)."""

    message_id: str
    model: str

    def message(
        self,
        content: list[dict[str, Any]],
        *,
        stop_reason: str | None,
        stop_sequence: str | None,
        usage: MessageUsage,
    ) -> dict[str, Any]:
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage.to_dict(),
        }

    def start(self, usage: MessageUsage) -> Event:
        body = self.message([], stop_reason=None, stop_sequence=None, usage=usage)
        return _event("message_start", message=body)

    @staticmethod
    def ping() -> Event:
        return _event("ping")

    @staticmethod
    def delta(stop_reason: str, stop_sequence: str | None, usage: MessageUsage) -> Event:
        body = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
        return _event("message_delta", delta=body, usage=usage.to_dict())

    @staticmethod
    def stop() -> Event:
        return _event("message_stop")


def _event(name: str, **fields: Any) -> Event:
    return name, {"type": name, **fields}
