"""OpenAI Chat Completions rendering: completion results -> aggregate body and stream chunks.

Imports the standard library and `chat.output_decoder` (for ToolCall) only: no sanic, no torch, no
engine; the server passes plain values (texts, calls, usage counts, a timings dict). SSE framing
is the server's job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ninfer.chat.output_decoder import ToolCall


@dataclass(frozen=True)
class CompletionUsage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
        }


def finish_reason(engine_reason: str, has_tool_calls: bool) -> str:
    """OpenAI finish_reason from the engine's: context exhaustion reads as `length`."""
    if engine_reason in ("length", "context"):
        return "length"
    return "tool_calls" if has_tool_calls else "stop"


def tool_call_dict(call: ToolCall, call_id: str, *, index: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {} if index is None else {"index": index}
    out.update(
        {
            "id": call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
    )
    return out


@dataclass(frozen=True)
class ChatRenderer:
    """Builds the JSON objects of one completion (aggregate body or stream chunks)."""

    completion_id: str
    model: str
    created: int
    include_usage: bool = False

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            out["usage"] = None
        out.update(extra)
        return out

    @staticmethod
    def _choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def role_chunk(self) -> dict[str, Any]:
        return self._chunk([self._choice({"role": "assistant", "content": ""})])

    def text_chunk(
        self, kind: str, text: str, timings: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """`kind` is "content" or "reasoning" (sent as reasoning_content)."""
        key = "reasoning_content" if kind == "reasoning" else "content"
        extra = {} if timings is None else {"timings": timings}
        return self._chunk([self._choice({key: text})], **extra)

    def tool_call_chunk(self, call: ToolCall, call_id: str) -> dict[str, Any]:
        delta = {"tool_calls": [tool_call_dict(call, call_id, index=call.index)]}
        return self._chunk([self._choice(delta)])

    def progress_chunk(self, progress: dict[str, Any]) -> dict[str, Any]:
        return self._chunk([self._choice({})], prompt_progress=progress)

    def finish_chunk(self, finish: str, timings: dict[str, Any] | None = None) -> dict[str, Any]:
        extra = {} if timings is None else {"timings": timings}
        return self._chunk([self._choice({}, finish)], **extra)

    def usage_chunk(self, usage: CompletionUsage, timings: dict[str, Any]) -> dict[str, Any]:
        return {**self._chunk([]), "usage": usage.to_dict(), "timings": timings}

    def completion(
        self,
        *,
        content: str,
        reasoning: str,
        tool_calls: list[dict[str, Any]],
        finish: str,
        usage: CompletionUsage,
        timings: dict[str, Any],
    ) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if tool_calls and not content else content,
            "refusal": None,
        }
        if reasoning:
            message["reasoning_content"] = reasoning
        if tool_calls:
            message["tool_calls"] = tool_calls
        return {
            "id": self.completion_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            ],
            "usage": usage.to_dict(),
            "timings": timings,
        }
