"""OpenAI Responses request parsing: a JSON body -> `ResponsesRequest` or ProtocolError.

Standard library and `protocol` only (no sanic, torch or engine). Unlike Chat Completions, every
top-level field is known: an unknown one fails with `unknown_parameter`, and recognized features
the engine cannot honour fail naming the field. Tools (direct or namespaced functions) get one
engine name per namespace/name pair, so outputs can restore the separate fields.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ninfer.protocol.errors import (
    ProtocolError,
    invalid,
    invalid_type,
    missing_or_type,
    opt_bool,
    unsupported,
)
from ninfer.protocol.openai_chat import (
    REASONING_EFFORTS,
    TemplateOptions,
    cache_implicit,
    parse_template_options,
)
from ninfer.protocol.openai_responses_items import normalize_input

NAMESPACE_JOIN = "__"  # engine tool name = namespace + "__" + name (the MCP naming convention)
MAX_METADATA = 16
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
SERVICE_TIERS = ("auto", "default")
CACHE_RETENTIONS = ("in-memory", "in_memory", "24h")
_NO_CONSTRAINT = "ninfer has no constrained decoding, so the output cannot be guaranteed to match"

CREATE_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "max_output_tokens",
        "stream",
        "store",
        "temperature",
        "top_p",
        "metadata",
        "client_metadata",
        "reasoning",
        "chat_template_kwargs",
        "preserve_thinking",
        "text",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_tool_calls",
        "truncation",
        "top_logprobs",
        "service_tier",
        "background",
        "include",
        "stream_options",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "safety_identifier",
        "user",
    }
)
COUNT_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "reasoning",
        "chat_template_kwargs",
        "preserve_thinking",
        "text",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "truncation",
    }
)
# Recognized OpenAI features with no local executor: rejected by name, never "unknown".
UNSUPPORTED_FEATURES = {
    "conversation": "Conversations are not supported; use previous_response_id",
    "prompt": "stored prompt templates are not supported",
    "context_management": "server-side context management is not supported",
    "moderation": "ninfer does not run hosted moderation",
}


@dataclass(frozen=True)
class ToolSet:
    """Declared tools (echoed), the template's effective tools, and engine name -> identity."""

    declared: list[dict[str, Any]] = field(default_factory=list)
    template_tools: list[dict[str, Any]] | None = None
    identities: dict[str, tuple[str | None, str]] = field(default_factory=dict)

    def identity(self, engine_name: str) -> tuple[str | None, str]:
        """(namespace, name) of a parsed call; only declared names reach the output parser."""
        return self.identities.get(engine_name, (None, engine_name))


def engine_tool_name(namespace: str | None, name: str) -> str:
    return name if namespace is None else f"{namespace}{NAMESPACE_JOIN}{name}"


@dataclass(frozen=True)
class ResponsesRequest:
    """A validated Create (or input_tokens) request; `None` fields were not given."""

    model: str | None
    input_items: list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    stream: bool = False
    store: bool = True
    sampling: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] | None = None
    reasoning_effort: str | None = None
    enable_thinking: bool | None = None  # from chat_template_kwargs
    preserve_thinking: bool | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: ToolSet = field(default_factory=ToolSet)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    max_tool_calls: int | None = None
    echo: dict[str, Any] = field(default_factory=dict)  # advisory fields the Response repeats
    cache_implicit: bool = True  # prompt_cache_options.mode != "explicit"

    def template_options(self, *, default_thinking: bool, preserve: bool) -> TemplateOptions:
        """`preserve` is already resolved (request, parent Response, or server default)."""
        thinking = self.enable_thinking
        if thinking is None and self.reasoning_effort is not None:
            thinking = self.reasoning_effort != "none"
        if thinking is None:
            thinking = default_thinking
        kwargs = dict(self.template_kwargs)
        if preserve:
            kwargs["preserve_thinking"] = True
        if self.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.reasoning_effort
        return TemplateOptions(thinking, kwargs)


def parse_responses_request(body: Any) -> ResponsesRequest:
    """Validate a Create body; raise ProtocolError (HTTP 400) naming the first bad field."""
    return _parse(body, CREATE_FIELDS, count_only=False)


def parse_input_tokens_request(body: Any) -> ResponsesRequest:
    """Validate a POST /v1/responses/input_tokens body: the prompt-shaping subset of Create."""
    return _parse(body, COUNT_FIELDS, count_only=True)


def _parse(body: Any, known: frozenset[str], *, count_only: bool) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise invalid_type("body", "a JSON object", body)
    for name in body:
        if name in UNSUPPORTED_FEATURES:
            raise unsupported(name, UNSUPPORTED_FEATURES[name])
        if name not in known:
            raise ProtocolError(
                f"{name}: unknown parameter", code="unknown_parameter", param=str(name)
            )
    model = body.get("model")
    required = not count_only or model is not None  # input_tokens may omit the model
    if required and (not isinstance(model, str) or not model):
        raise missing_or_type(body, "model", "a non-empty string")
    previous = body.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise invalid_type("previous_response_id", "a non-empty string", previous)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid_type("instructions", "a string", instructions)
    _check_text(body.get("text"))
    truncation = body.get("truncation")
    if truncation not in (None, "disabled"):
        if truncation == "auto":
            raise unsupported(
                "truncation", "'auto' would silently drop Items; overlong input fails instead"
            )
        raise invalid("truncation", f"must be 'disabled' or 'auto', got {truncation!r}")
    effort = _parse_reasoning(body.get("reasoning"))
    merged = {k: body.get(k) for k in ("chat_template_kwargs", "preserve_thinking")}
    merged["reasoning_effort"] = effort
    enable, preserve, effort, kwargs = parse_template_options(merged)
    tools = _parse_tools(body.get("tools"), body.get("tool_choice"))
    parallel = opt_bool(body, "parallel_tool_calls")
    if parallel is False and tools.template_tools:
        raise unsupported(
            "parallel_tool_calls", "false cannot be enforced: the model may emit several calls"
        )
    request = ResponsesRequest(
        model=model,
        input_items=normalize_input(body.get("input")),
        instructions=instructions,
        previous_response_id=previous,
        reasoning_effort=effort,
        enable_thinking=enable,
        preserve_thinking=preserve,
        template_kwargs=kwargs,
        tools=tools,
        tool_choice=body.get("tool_choice") or "auto",
        parallel_tool_calls=parallel is not False,
    )
    if count_only:
        return request
    return _with_create_fields(request, body)


def _with_create_fields(request: ResponsesRequest, body: Mapping[str, Any]) -> ResponsesRequest:
    stream = opt_bool(body, "stream") or False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise invalid_type("stream_options", "an object", options)
        if not stream:
            raise invalid("stream_options", "is only allowed when stream is true")
        for name in options:
            if name != "include_obfuscation":
                raise ProtocolError(
                    f"stream_options.{name}: unknown parameter",
                    code="unknown_parameter",
                    param=f"stream_options.{name}",
                )
        opt_bool(options, "include_obfuscation", "stream_options.")
    if opt_bool(body, "background"):
        raise unsupported("background", "background execution is not supported")
    include = body.get("include")
    if include is not None:
        if not isinstance(include, list):
            raise invalid_type("include", "an array", include)
        if include:
            raise unsupported("include", "no optional output data (include) can be added")
    top = body.get("top_logprobs")
    if top is not None and top != 0:
        if not isinstance(top, int) or isinstance(top, bool):
            raise invalid_type("top_logprobs", "an integer", top)
        raise unsupported("top_logprobs", "log probabilities are not returned")
    tier = body.get("service_tier")
    if tier is not None and tier not in SERVICE_TIERS:
        raise unsupported("service_tier", f"only auto or default is served, got {tier!r}")
    client_metadata = body.get("client_metadata")
    if client_metadata is not None and not isinstance(client_metadata, dict):
        raise invalid_type("client_metadata", "an object or null", client_metadata)
    echo = _parse_client_hints(body)
    return replace(
        request,
        max_output_tokens=_opt_count(body, "max_output_tokens"),
        stream=stream,
        store=opt_bool(body, "store") is not False,
        sampling=_parse_sampling(body),
        metadata=_parse_metadata(body.get("metadata")),
        max_tool_calls=_opt_count(body, "max_tool_calls"),
        echo=echo,
        cache_implicit=cache_implicit(body),
    )


# -- scalars ------------------------------------------------------------------------------------


def _opt_count(obj: Mapping[str, Any], name: str) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise invalid(name, f"must be a non-negative integer, got {value!r}")
    return value


def _parse_sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name, (low, high) in {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}.items():
        value = body.get(name)
        if value is None:
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or not low <= value <= high:
            raise invalid(name, f"must be a finite number in [{low:g}, {high:g}], got {value!r}")
        out[name] = float(value)
    return out


def _parse_metadata(metadata: Any) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise invalid_type("metadata", "an object of strings", metadata)
    if len(metadata) > MAX_METADATA:
        raise invalid("metadata", f"at most {MAX_METADATA} pairs are allowed")
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY:
            raise invalid(f"metadata.{key}", f"keys are at most {MAX_METADATA_KEY} characters")
        if not isinstance(value, str):
            raise invalid_type(f"metadata.{key}", "a string", value)
        if len(value) > MAX_METADATA_VALUE:
            raise invalid(f"metadata.{key}", f"values are at most {MAX_METADATA_VALUE} characters")
    return dict(metadata)


def _parse_client_hints(body: Mapping[str, Any]) -> dict[str, Any]:
    """Advisory cache and client hints: validated, echoed, no effect on generation."""
    echo: dict[str, Any] = {}
    for name in ("prompt_cache_key", "safety_identifier", "user"):
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            raise invalid_type(name, "a string", value)
        echo[name] = value
    retention = body.get("prompt_cache_retention")
    if retention is not None and retention not in CACHE_RETENTIONS:
        raise invalid("prompt_cache_retention", f"must be one of {', '.join(CACHE_RETENTIONS)}")
    echo["prompt_cache_retention"] = retention
    options = body.get("prompt_cache_options")
    if options is not None:
        if not isinstance(options, dict):
            raise invalid_type("prompt_cache_options", "an object", options)
        if options.get("mode") not in ("implicit", "explicit"):
            raise invalid("prompt_cache_options.mode", "must be 'implicit' or 'explicit'")
    return echo


def _check_text(text: Any) -> None:
    if text is None:
        return
    if not isinstance(text, dict):
        raise invalid_type("text", "an object", text)
    fmt = text.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise invalid_type("text.format", "an object", fmt)
        if fmt.get("type") != "text":
            raise unsupported("text.format", f"only type 'text' is supported; {_NO_CONSTRAINT}")
    verbosity = text.get("verbosity")
    if verbosity not in (None, "medium"):
        raise unsupported(
            "text.verbosity", "only 'medium' is supported; output length is not steered"
        )


def _parse_reasoning(reasoning: Any) -> str | None:
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise invalid_type("reasoning", "an object", reasoning)
    effort = reasoning.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise invalid(
            "reasoning.effort", f"must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}"
        )
    for name in ("summary", "generate_summary"):
        value = reasoning.get(name)
        if value not in (None, "auto", "none"):
            raise unsupported(
                f"reasoning.{name}", "reasoning summaries are not generated (raw reasoning is)"
            )
    return effort


# -- tools --------------------------------------------------------------------------------------


def _parse_tools(tools: Any, choice: Any) -> ToolSet:
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise invalid_type("tools", "an array", tools)
    declared: list[dict[str, Any]] = []
    entries: list[tuple[str | None, dict[str, Any]]] = []  # (namespace, function definition)
    for i, tool in enumerate(tools):
        param = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid_type(param, "an object", tool)
        kind = tool.get("type")
        if kind == "function":
            entries.append((None, _check_function(param, tool)))
        elif kind == "namespace":
            name = tool.get("name")
            if not isinstance(name, str) or not name:
                raise invalid_type(f"{param}.name", "a non-empty string", name)
            members = tool.get("tools")
            if not isinstance(members, list) or not members:
                raise invalid_type(f"{param}.tools", "a non-empty array of functions", members)
            for j, member in enumerate(members):
                where = f"{param}.tools[{j}]"
                if not isinstance(member, dict) or member.get("type") != "function":
                    raise unsupported(f"{where}.type", "namespaces may contain function tools only")
                entries.append((name, _check_function(where, member)))
        else:
            raise unsupported(
                f"{param}.type",
                f"tool type {kind!r} is not supported: only client-executed function tools "
                "(direct or in a namespace); ninfer runs no hosted, MCP or custom tools",
            )
        declared.append(tool)
    identities: dict[str, tuple[str | None, str]] = {}
    template_tools = []
    for namespace, fn in entries:
        engine_name = engine_tool_name(namespace, fn["name"])
        if engine_name in identities:
            raise invalid(
                "tools", f"the tool {engine_name!r} is declared more than once", "duplicate_tool"
            )
        identities[engine_name] = (namespace, fn["name"])
        spec = {"name": engine_name}
        for key in ("description", "parameters"):
            if fn.get(key) is not None:
                spec[key] = fn[key]
        template_tools.append({"type": "function", "function": spec})
    allowed = _allowed_tools(choice)
    if allowed is not None:
        for namespace, name in allowed:
            if engine_tool_name(namespace, name) not in identities:
                raise invalid("tool_choice", f"allowed tool {name!r} is not declared in tools")
        names = {engine_tool_name(ns, n) for ns, n in allowed}
        template_tools = [t for t in template_tools if t["function"]["name"] in names]
    return ToolSet(declared, template_tools or None, identities)


def _check_function(param: str, tool: Mapping[str, Any]) -> dict[str, Any]:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise missing_or_type(tool, "name", "a non-empty string", prefix=f"{param}.")
    if tool.get("strict") is True:
        raise unsupported(
            f"{param}.strict", f"strict schemas need constrained decoding; {_NO_CONSTRAINT}"
        )
    if tool.get("defer_loading") is True:
        raise unsupported(f"{param}.defer_loading", "deferred tool loading is not supported")
    if tool.get("output_schema") is not None:
        raise unsupported(f"{param}.output_schema", "tool output schemas are not enforced")
    callers = tool.get("allowed_callers")
    if callers is not None and (not isinstance(callers, list) or "direct" not in callers):
        raise unsupported(
            f"{param}.allowed_callers", "the model calls tools directly; it must be allowed"
        )
    params = tool.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise invalid_type(f"{param}.parameters", "an object", params)
    desc = tool.get("description")
    if desc is not None and not isinstance(desc, str):
        raise invalid_type(f"{param}.description", "a string", desc)
    return dict(tool)


def _allowed_tools(choice: Any) -> list[tuple[str | None, str]] | None:
    """The allowed (namespace, name) pairs; None for every declared tool."""
    if choice is None or choice == "auto":
        return None
    if choice == "none":
        return []
    if choice == "required":
        raise unsupported("tool_choice", "'required' needs constrained decoding to force a call")
    if not isinstance(choice, dict):
        raise invalid("tool_choice", f"must be 'auto', 'none' or an object, got {choice!r}")
    if choice.get("type") != "allowed_tools":
        raise unsupported("tool_choice", "a named or hosted tool choice needs constrained decoding")
    if choice.get("mode") != "auto":
        raise unsupported("tool_choice.mode", "only mode 'auto' is supported")
    entries = choice.get("tools")
    if not isinstance(entries, list):
        raise invalid_type("tool_choice.tools", "an array", entries)
    out = []
    for i, entry in enumerate(entries):
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or entry.get("type") != "function":
            raise unsupported(f"tool_choice.tools[{i}]", "only function tools can be allowed")
        namespace = entry.get("namespace")
        if namespace is not None and not isinstance(namespace, str):
            raise invalid_type(f"tool_choice.tools[{i}].namespace", "a string", namespace)
        out.append((namespace, name))
    return out
