"""Anthropic Messages request parsing: JSON body -> `MessagesRequest` or ProtocolError.

Imports the standard library and `protocol.*` only (no sanic, no torch, no engine). History
lowering lives in `anthropic_messages`, response rendering in `anthropic_render`. Like the Chat
Completions parser it rejects what the engine cannot honour (naming the field and the lost
guarantee) and ignores advisory fields (metadata, service tier, geography, unknown names).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ninfer.protocol.anthropic_messages import (
    TOOLS_MARK,
    CacheMarks,
    cache_ttl,
    lower_messages,
    lower_system,
)
from ninfer.protocol.errors import (
    conflicting_template_option,
    invalid,
    invalid_type,
    opt_bool,
    unsupported,
)
from ninfer.protocol.openai_chat import check_bool, merge_template_option, template_kwargs

MIN_BUDGET_TOKENS = 1024  # Anthropic's minimum for thinking.budget_tokens
MAX_STOP_SEQUENCES = 4  # the engine's stop-string limit
TOP_K_MAX = 20
EFFORTS = ("low", "medium", "high", "max")
THINKING_TYPES = ("enabled", "adaptive", "disabled")
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
_NO_CONSTRAINT = "ninfer has no constrained decoding, so the output cannot be guaranteed"
# Top-level fields that ask for an executor or store ninfer does not have.
_UNSUPPORTED_FIELDS = {
    "mcp_servers": "MCP servers are not available",
    "container": "code-execution containers are not available",
    "output_format": f"Structured Outputs need constrained decoding; {_NO_CONSTRAINT}",
}


@dataclass(frozen=True)
class MessagesRequest:
    """A validated Messages (or count_tokens) request, lowered for the chat template."""

    model: str
    messages: list[dict[str, Any]]  # template-ready, system messages included
    prefill: bool  # the last message is an assistant turn that generation continues
    tools: list[dict[str, Any]] | None  # Chat-Completions-shaped effective tools
    max_tokens: int  # the complete output budget (the server default when omitted)
    stream: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)
    stop: tuple[str, ...] = ()
    thinking: str | None = None  # enabled | adaptive | disabled | None (server default)
    budget_tokens: int | None = None
    preserve_thinking: bool | None = None
    effort: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # explicit cache_control breakpoints as (message index or TOOLS_MARK, characters of its
    # content before the boundary; None: the whole content)
    cache_marks: tuple[tuple[int, int | None], ...] = ()

    def enable_thinking(self, default: bool) -> bool:
        """Whether generation starts in thinking mode; a prefill continues text, never thinks."""
        if self.prefill:
            return False
        if self.thinking is None:
            return default
        return self.thinking != "disabled"

    def render_kwargs(self, *, default_thinking: bool, default_preserve: bool) -> dict[str, Any]:
        """Template kwargs for Engine.render / achat (enable_thinking included)."""
        kwargs = dict(self.template_kwargs)
        kwargs["enable_thinking"] = self.enable_thinking(default_thinking)
        preserve = default_preserve if self.preserve_thinking is None else self.preserve_thinking
        if preserve:
            kwargs["preserve_thinking"] = True
        if self.effort is not None:
            kwargs["reasoning_effort"] = self.effort
        if self.prefill:
            kwargs["add_generation_prompt"] = False
        return kwargs


def parse_messages_request(
    body: Any, *, default_max_tokens: int, count_only: bool = False
) -> MessagesRequest:
    """Validate a decoded body; raise ProtocolError (HTTP 400) naming the first bad field.

    `count_only` parses a count_tokens body: output-only fields (max_tokens, sampling, stop,
    stream) are not required and do not affect the result.
    """
    if not isinstance(body, dict):
        raise invalid_type("body", "a JSON object", body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        if model is None:
            raise invalid("model", "is required", code="missing_required_parameter")
        raise invalid_type("model", "a non-empty string", model)
    _reject_unsupported(body)
    marks = CacheMarks()
    tools = _parse_tools(body, marks)
    system = lower_system(body.get("system"), marks)
    history = lower_messages(body.get("messages"), marks)
    marks.request_level(body.get("cache_control"))
    max_tokens = default_max_tokens if count_only else _parse_max_tokens(body, default_max_tokens)
    thinking, budget = _parse_thinking(body.get("thinking"), max_tokens, count_only)
    effort = _parse_effort(body.get("output_config"))
    kwargs, preserve, thinking = _parse_template_kwargs(body, thinking, effort)
    if history.prefill and thinking in ("enabled", "adaptive"):
        raise unsupported(
            "thinking",
            "an assistant prefill continues its text and cannot start with thinking enabled",
            "invalid_prefill",
        )
    return MessagesRequest(
        model=model,
        messages=system + history.messages,
        prefill=history.prefill,
        tools=tools,
        max_tokens=max_tokens,
        stream=False if count_only else opt_bool(body, "stream") or False,
        sampling={} if count_only else _parse_sampling(body),
        stop=() if count_only else _parse_stop(body.get("stop_sequences")),
        thinking=thinking,
        budget_tokens=budget,
        preserve_thinking=preserve,
        effort=effort,
        template_kwargs=kwargs,
        cache_marks=tuple(marks.positions),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _reject_unsupported(body: Mapping[str, Any]) -> None:
    for name, why in _UNSUPPORTED_FIELDS.items():
        value = body.get(name)
        if value is not None and value != [] and value != {}:
            raise unsupported(name, why)
    _check_context_management(body.get("context_management"))


def _check_context_management(raw: Any) -> None:
    """Server-side context edits cannot run; an edit that keeps everything is a no-op."""
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise invalid_type("context_management", "an object", raw)
    edits = raw.get("edits") or []
    if not isinstance(edits, list):
        raise invalid_type("context_management.edits", "an array", edits)
    for i, edit in enumerate(edits):
        kind = edit.get("type") if isinstance(edit, dict) else None
        keeps_all = isinstance(kind, str) and kind.startswith("clear_thinking")
        if not (keeps_all and edit.get("keep") == "all"):
            raise unsupported(
                f"context_management.edits[{i}]", "server-side context editing is not available"
            )


def _parse_max_tokens(body: Mapping[str, Any], default: int) -> int:
    value = body.get("max_tokens")
    if value is None:
        return default
    if not _is_int(value) or value < 0:
        raise invalid("max_tokens", f"must be a positive integer, got {value!r}")
    if value == 0:
        raise unsupported(
            "max_tokens",
            "0 is not supported: ninfer has no zero-output cache-prewarm lifecycle",
            "unsupported_value",
        )
    return value


def _parse_thinking(raw: Any, max_tokens: int, count_only: bool) -> tuple[str | None, int | None]:
    if raw is None:
        return None, None
    if not isinstance(raw, dict):
        raise invalid_type("thinking", "an object", raw)
    kind = raw.get("type")
    if kind not in THINKING_TYPES:
        raise invalid("thinking.type", f"must be one of {', '.join(THINKING_TYPES)}, got {kind!r}")
    display = raw.get("display")
    if display == "omitted":
        raise unsupported(
            "thinking.display",
            "'omitted' needs encrypted hidden-reasoning restore, which ninfer cannot provide",
            "unsupported_value",
        )
    if display not in (None, "summarized"):
        raise invalid("thinking.display", f"must be 'summarized' or 'omitted', got {display!r}")
    if kind != "enabled":
        return kind, None
    budget = raw.get("budget_tokens")
    if budget is None:
        raise invalid("thinking.budget_tokens", "is required", code="missing_required_parameter")
    if not _is_int(budget) or budget < MIN_BUDGET_TOKENS:
        raise invalid(
            "thinking.budget_tokens", f"must be an integer >= {MIN_BUDGET_TOKENS}, got {budget!r}"
        )
    if not count_only and budget >= max_tokens:
        raise invalid(
            "thinking.budget_tokens",
            f"must be less than max_tokens ({max_tokens}), got {budget}",
        )
    return kind, budget


def _parse_effort(raw: Any) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise invalid_type("output_config", "an object", raw)
    if raw.get("format") is not None:
        raise unsupported(
            "output_config.format",
            f"Structured Outputs need constrained decoding; {_NO_CONSTRAINT}",
        )
    effort = raw.get("effort")
    if effort is not None and effort not in EFFORTS:
        raise invalid(
            "output_config.effort", f"must be one of {', '.join(EFFORTS)}, got {effort!r}"
        )
    return effort


def _parse_template_kwargs(
    body: Mapping[str, Any], thinking: str | None, effort: str | None
) -> tuple[dict[str, Any], bool | None, str | None]:
    """Extra template kwargs, preserve_thinking, and the thinking type (kwargs may set it)."""
    kwargs = template_kwargs(body)
    enable = kwargs.pop("enable_thinking", None)
    if enable is not None:
        check_bool("chat_template_kwargs.enable_thinking", enable)
        if thinking is not None and enable != (thinking != "disabled"):
            raise conflicting_template_option(
                f"enable_thinking is {enable} but thinking.type is {thinking!r}"
            )
        if thinking is None:
            thinking = "adaptive" if enable else "disabled"
    inner_effort = kwargs.pop("reasoning_effort", None)
    if inner_effort is not None and effort is not None and inner_effort != effort:
        raise conflicting_template_option(
            "chat_template_kwargs.reasoning_effort and output_config.effort disagree"
        )
    if inner_effort is not None and effort is None:
        kwargs["reasoning_effort"] = inner_effort
    preserve = merge_template_option(body, kwargs, "preserve_thinking", check_bool)
    return kwargs, preserve, thinking


def _parse_sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is None:
            continue
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise invalid(name, f"must be a number in [0, 1], got {value!r}")
        out[name] = float(value)
    top_k = body.get("top_k")
    if top_k is not None:
        if not _is_int(top_k) or not 0 <= top_k <= TOP_K_MAX:
            raise invalid("top_k", f"must be an integer in 0..{TOP_K_MAX}, got {top_k!r}")
        out["top_k"] = top_k
    return out


def _parse_stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid_type("stop_sequences", "an array of strings", stop)
    if len(stop) > MAX_STOP_SEQUENCES:
        raise invalid(
            "stop_sequences", f"at most {MAX_STOP_SEQUENCES} stop sequences are supported"
        )
    if any(not s for s in stop):
        raise invalid("stop_sequences", "stop sequences must be non-empty")
    return tuple(stop)


# -- tools ------------------------------------------------------------------------------------


def _parse_tools(body: Mapping[str, Any], marks: CacheMarks) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise invalid_type("tools", "an array", tools)
    out, names = [], set()
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        out.append(_parse_tool(param, tool))
        if tool["name"] in names:
            raise invalid(f"{param}.name", f"duplicate tool name {tool['name']!r}")
        names.add(tool["name"])
        # only the end of the whole tool list is a prompt boundary (after the declarations)
        marks.block(param, tool, at=True if i == len(tools) - 1 else None)
    marks.resolve(lambda at: (TOOLS_MARK, None))
    choice = body.get("tool_choice")
    if choice is None:
        return out or None
    if not isinstance(choice, dict):
        raise invalid_type("tool_choice", "an object", choice)
    kind = choice.get("type")
    if kind in ("any", "tool"):
        raise unsupported(
            "tool_choice.type", f"{kind!r} forces a call, which needs constrained decoding"
        )
    if kind not in ("auto", "none"):
        raise invalid("tool_choice.type", f"must be auto, none, any or tool, got {kind!r}")
    if opt_bool(choice, "disable_parallel_tool_use", "tool_choice.") and kind == "auto" and out:
        raise unsupported(
            "tool_choice.disable_parallel_tool_use",
            "single-call enforcement needs constrained decoding: the model may emit several calls",
        )
    return None if kind == "none" else out or None


def _parse_tool(param: str, tool: Any) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise invalid_type(param, "an object", tool)
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise unsupported(
            f"{param}.type",
            f"{kind!r} is an Anthropic-provided or server tool; only user-defined tools run here",
        )
    name = tool.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise invalid(f"{param}.name", f"must match {TOOL_NAME.pattern}, got {name!r}")
    if tool.get("strict") is True:
        raise unsupported(
            f"{param}.strict", f"strict schemas need constrained decoding; {_NO_CONSTRAINT}"
        )
    if tool.get("defer_loading") is True:
        raise unsupported(f"{param}.defer_loading", "deferred tools need a tool-search executor")
    callers = tool.get("allowed_callers")
    if callers is not None and (not isinstance(callers, list) or "direct" not in callers):
        raise unsupported(
            f"{param}.allowed_callers", "tools that the model may not call directly cannot run"
        )
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        if schema is None:
            raise invalid(f"{param}.input_schema", "is required", code="missing_required_parameter")
        raise invalid_type(f"{param}.input_schema", "an object", schema)
    if schema.get("type") != "object":
        raise invalid(f"{param}.input_schema.type", "must be 'object'")
    description = tool.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid_type(f"{param}.description", "a string", description)
    if tool.get("cache_control") is not None:
        cache_ttl(f"{param}.cache_control", tool["cache_control"])
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    function["parameters"] = schema
    examples = tool.get("input_examples")
    if examples is not None:
        if not isinstance(examples, list) or not all(isinstance(e, dict) for e in examples):
            raise invalid_type(f"{param}.input_examples", "an array of objects", examples)
        function["input_examples"] = examples
    return {"type": "function", "function": function}
