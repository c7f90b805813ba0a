"""OpenAI Responses request parsing: a JSON body -> `ResponsesRequest` or ProtocolError.

Standard library and `protocol` only. Every top-level field is known (unknown ones fail), fields
are checked independently so one 400 names every problem, and each client tool (function,
namespace, custom, local_shell) gets one engine name; hosted tools are accepted but not offered.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ninfer.protocol.errors import (
    ErrorCollector,
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
from ninfer.protocol.openai_responses_items import LOCAL_SHELL, normalize_input
from ninfer.protocol.reasoning_seal import ReasoningSeal

NAMESPACE_JOIN = "__"  # engine tool name = namespace + "__" + name (the MCP naming convention)
MAX_METADATA = 16
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
SERVICE_TIERS = ("auto", "default")
CACHE_RETENTIONS = ("in-memory", "in_memory", "24h")
VERBOSITIES = ("low", "medium", "high")
ENCRYPTED_REASONING = "reasoning.encrypted_content"
# `include` values naming output data ninfer cannot produce (rejected by name, never "unknown").
UNSUPPORTED_INCLUDES = {
    "message.output_text.logprobs": "log probabilities are not returned",
    "message.input_image.image_url": "image input is not echoed",
    "computer_call_output.output.image_url": "no computer-use tool runs here",
    "code_interpreter_call.outputs": "no code interpreter runs here",
    "file_search_call.results": "no file search runs here",
    "web_search_call.results": "no web search runs here",
    "web_search_call.action.sources": "no web search runs here",
}
# Tools that a hosted platform runs: accepted so agent tool sets work unchanged, never offered to
# the model (nothing here could execute them), and named in the x-ninfer-ignored-tools header.
HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "code_interpreter",
        "image_generation",
        "computer_use_preview",
        "computer",
        "mcp",
        "tool_search",
    }
)
LOCAL_SHELL_TOOL = {
    "name": LOCAL_SHELL,
    "description": "Runs a command on the user's machine and returns its output.",
    "parameters": {
        "type": "object",
        "properties": {
            "command": {
                "type": "array",
                "items": {"type": "string"},
                "description": 'The command and its arguments (argv), e.g. ["ls", "-la"].',
            },
            "working_directory": {"type": "string", "description": "Directory to run in."},
            "timeout_ms": {"type": "integer", "description": "Time limit in milliseconds."},
            "env": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "Extra environment variables.",
            },
            "user": {"type": "string", "description": "User to run the command as."},
        },
        "required": ["command"],
    },
}
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
    kinds: dict[str, str] = field(default_factory=dict)  # engine name -> function|custom|...
    ignored: tuple[str, ...] = ()  # hosted tool types accepted but not offered to the model

    def identity(self, engine_name: str) -> tuple[str | None, str]:
        """(namespace, name) of a parsed call; only declared names reach the output parser."""
        return self.identities.get(engine_name, (None, engine_name))

    def kind(self, engine_name: str) -> str:
        return self.kinds.get(engine_name, "function")


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
    include_encrypted_reasoning: bool = False
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


def parse_responses_request(body: Any, *, seal: ReasoningSeal | None = None) -> ResponsesRequest:
    """Validate a Create body; raise one ProtocolError (HTTP 400) naming every bad field.

    `seal` opens reasoning Items replayed with only this server's `encrypted_content`.
    """
    return _parse(body, CREATE_FIELDS, count_only=False, seal=seal)


def parse_input_tokens_request(body: Any, *, seal: ReasoningSeal | None = None) -> ResponsesRequest:
    """Validate a POST /v1/responses/input_tokens body: the prompt-shaping subset of Create."""
    return _parse(body, COUNT_FIELDS, count_only=True, seal=seal)


def _parse(
    body: Any, known: frozenset[str], *, count_only: bool, seal: ReasoningSeal | None
) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise invalid_type("body", "a JSON object", body)
    errors = ErrorCollector()
    for name in body:
        with errors.check():
            if name in UNSUPPORTED_FEATURES:
                raise unsupported(name, UNSUPPORTED_FEATURES[name])
            if name not in known:
                raise ProtocolError(
                    f"{name}: unknown parameter", code="unknown_parameter", param=str(name)
                )
    model = body.get("model")
    with errors.check():
        required = not count_only or model is not None  # input_tokens may omit the model
        if required and (not isinstance(model, str) or not model):
            raise missing_or_type(body, "model", "a non-empty string")
    previous = body.get("previous_response_id")
    with errors.check():
        if previous is not None and (not isinstance(previous, str) or not previous):
            raise invalid_type("previous_response_id", "a non-empty string", previous)
    instructions = body.get("instructions")
    with errors.check():
        if instructions is not None and not isinstance(instructions, str):
            raise invalid_type("instructions", "a string", instructions)
    verbosity = None
    with errors.check():
        verbosity = _check_text(body.get("text"))
    with errors.check():
        truncation = body.get("truncation")
        if truncation not in (None, "disabled"):
            if truncation == "auto":
                raise unsupported(
                    "truncation", "'auto' would silently drop Items; overlong input fails instead"
                )
            raise invalid("truncation", f"must be 'disabled' or 'auto', got {truncation!r}")
    template: tuple[Any, ...] = (None, None, None, {})
    with errors.check():
        effort = _parse_reasoning(body.get("reasoning"))
        merged = {k: body.get(k) for k in ("chat_template_kwargs", "preserve_thinking")}
        merged["reasoning_effort"] = effort
        template = parse_template_options(merged)
    enable, preserve, effort, kwargs = template
    tools = ToolSet()
    with errors.check():
        tools = _parse_tools(body.get("tools"), body.get("tool_choice"))
    parallel = None
    with errors.check():
        parallel = opt_bool(body, "parallel_tool_calls")
    items: list[dict[str, Any]] = []
    with errors.check():
        items = normalize_input(body.get("input"), seal=seal)
    request = ResponsesRequest(
        model=model,
        input_items=items,
        instructions=instructions,
        previous_response_id=previous,
        reasoning_effort=effort,
        enable_thinking=enable,
        preserve_thinking=preserve,
        template_kwargs=kwargs,
        tools=tools,
        tool_choice=body.get("tool_choice") or "auto",
        parallel_tool_calls=parallel is not False,
        echo={"verbosity": verbosity},
    )
    if not count_only:
        with errors.check():
            request = _with_create_fields(request, body, errors)
    errors.raise_any()
    return request


def _with_create_fields(
    request: ResponsesRequest, body: Mapping[str, Any], errors: ErrorCollector
) -> ResponsesRequest:
    stream = False
    with errors.check():
        stream = opt_bool(body, "stream") or False
    with errors.check():
        _check_stream_options(body.get("stream_options"), stream)
    with errors.check():
        if opt_bool(body, "background"):
            raise unsupported("background", "background execution is not supported")
    include = False
    with errors.check():
        include = _parse_include(body.get("include"))
    with errors.check():
        top = body.get("top_logprobs")
        if top is not None and top != 0:
            if not isinstance(top, int) or isinstance(top, bool):
                raise invalid_type("top_logprobs", "an integer", top)
            raise unsupported("top_logprobs", "log probabilities are not returned")
    with errors.check():
        tier = body.get("service_tier")
        if tier is not None and tier not in SERVICE_TIERS:
            raise unsupported("service_tier", f"only auto or default is served, got {tier!r}")
    with errors.check():
        client_metadata = body.get("client_metadata")
        if client_metadata is not None and not isinstance(client_metadata, dict):
            raise invalid_type("client_metadata", "an object or null", client_metadata)
    echo = dict(request.echo)
    with errors.check():
        echo.update(_parse_client_hints(body))
    fields: dict[str, Any] = {}
    for name, parse in (
        ("max_output_tokens", lambda: _opt_count(body, "max_output_tokens")),
        ("store", lambda: opt_bool(body, "store") is not False),
        ("sampling", lambda: _parse_sampling(body)),
        ("metadata", lambda: _parse_metadata(body.get("metadata"))),
        ("max_tool_calls", lambda: _opt_count(body, "max_tool_calls")),
    ):
        with errors.check():
            fields[name] = parse()
    return replace(
        request,
        stream=stream,
        include_encrypted_reasoning=include,
        echo=echo,
        cache_implicit=cache_implicit(body),
        **fields,
    )


def _check_stream_options(options: Any, stream: bool) -> None:
    if options is None:
        return
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


def _parse_include(include: Any) -> bool:
    """Whether reasoning Items carry `encrypted_content`; other output data is rejected."""
    if include is None:
        return False
    if not isinstance(include, list):
        raise invalid_type("include", "an array", include)
    errors = ErrorCollector()
    for i, value in enumerate(include):
        with errors.check():
            if not isinstance(value, str):
                raise invalid_type(f"include[{i}]", "a string", value)
            if value in UNSUPPORTED_INCLUDES:
                raise unsupported(f"include[{i}]", f"{value!r}: {UNSUPPORTED_INCLUDES[value]}")
            if value != ENCRYPTED_REASONING:
                raise invalid(f"include[{i}]", f"unknown include value {value!r}")
    errors.raise_any()
    return ENCRYPTED_REASONING in include


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


def _check_text(text: Any) -> str | None:
    """The requested verbosity: a neutral hint (echoed, no effect on generation)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise invalid_type("text", "an object", text)
    fmt = text.get("format")
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise invalid_type("text.format", "an object", fmt)
        if fmt.get("type") != "text":
            raise unsupported("text.format", f"only type 'text' is supported; {_NO_CONSTRAINT}")
    verbosity = text.get("verbosity")
    if verbosity is not None and verbosity not in VERBOSITIES:
        raise invalid(
            "text.verbosity", f"must be one of {', '.join(VERBOSITIES)}, got {verbosity!r}"
        )
    return verbosity


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
    # (namespace, kind, function definition the model is offered)
    entries: list[tuple[str | None, str, dict[str, Any]]] = []
    ignored: list[str] = []
    errors = ErrorCollector()
    for i, tool in enumerate(tools):
        with errors.check():
            param = f"tools[{i}]"
            if not isinstance(tool, dict):
                raise invalid_type(param, "an object", tool)
            kind = tool.get("type")
            if kind == "function":
                entries.append((None, "function", _check_function(param, tool)))
            elif kind == "namespace":
                entries += _namespace_entries(param, tool)
            elif kind == "custom":
                entries.append((None, "custom", _custom_function(param, tool)))
            elif kind == "local_shell":
                entries.append((None, "local_shell", dict(LOCAL_SHELL_TOOL)))
            elif isinstance(kind, str) and kind in HOSTED_TOOLS:
                ignored.append(kind)
            else:
                raise unsupported(
                    f"{param}.type",
                    f"tool type {kind!r} is not supported: function, namespace, custom and "
                    "local_shell tools run on the client; hosted tools "
                    f"({', '.join(sorted(HOSTED_TOOLS))}) are accepted and not offered",
                )
            declared.append(tool)
    errors.raise_any()
    identities: dict[str, tuple[str | None, str]] = {}
    kinds: dict[str, str] = {}
    template_tools = []
    for namespace, kind, fn in entries:
        engine_name = engine_tool_name(namespace, fn["name"])
        if engine_name in identities:
            raise invalid(
                "tools", f"the tool {engine_name!r} is declared more than once", "duplicate_tool"
            )
        identities[engine_name] = (namespace, fn["name"])
        kinds[engine_name] = kind
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
    return ToolSet(
        declared, template_tools or None, identities, kinds, tuple(dict.fromkeys(ignored))
    )


def _namespace_entries(
    param: str, tool: Mapping[str, Any]
) -> list[tuple[str | None, str, dict[str, Any]]]:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_type(f"{param}.name", "a non-empty string", name)
    members = tool.get("tools")
    if not isinstance(members, list) or not members:
        raise invalid_type(f"{param}.tools", "a non-empty array of functions", members)
    out: list[tuple[str | None, str, dict[str, Any]]] = []
    for j, member in enumerate(members):
        where = f"{param}.tools[{j}]"
        if not isinstance(member, dict) or member.get("type") != "function":
            raise unsupported(f"{where}.type", "namespaces may contain function tools only")
        out.append((name, "function", _check_function(where, member)))
    return out


def _custom_function(param: str, tool: Mapping[str, Any]) -> dict[str, Any]:
    """A freeform tool offered as a function of one string `input` (the model cannot be held to
    the grammar: there is no constrained decoding, so the grammar is shown, not enforced)."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise missing_or_type(tool, "name", "a non-empty string", prefix=f"{param}.")
    desc = tool.get("description")
    if desc is not None and not isinstance(desc, str):
        raise invalid_type(f"{param}.description", "a string", desc)
    if tool.get("defer_loading") is True:
        raise unsupported(f"{param}.defer_loading", "deferred tool loading is not supported")
    fmt = tool.get("format")
    note = "This is a FREEFORM tool: its `input` is raw text, not JSON."
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise invalid_type(f"{param}.format", "an object", fmt)
        kind = fmt.get("type")
        if kind == "grammar":
            syntax, definition = fmt.get("syntax"), fmt.get("definition")
            if not isinstance(syntax, str) or not isinstance(definition, str):
                raise invalid(
                    f"{param}.format", "a grammar format needs string syntax and definition"
                )
            note += f" The input must follow this {syntax} grammar:\n{definition}"
        elif kind != "text":
            raise invalid(f"{param}.format.type", f"must be 'text' or 'grammar', got {kind!r}")
    description = f"{desc}\n\n{note}" if desc else note
    return {
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": {"input": {"type": "string", "description": "The raw input text."}},
            "required": ["input"],
        },
    }


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
        if not isinstance(entry, dict):
            raise invalid_type(f"tool_choice.tools[{i}]", "an object", entry)
        name = entry.get("name")
        if entry.get("type") == "local_shell":
            out.append((None, LOCAL_SHELL))
            continue
        if not isinstance(name, str) or entry.get("type") not in ("function", "custom"):
            raise unsupported(
                f"tool_choice.tools[{i}]",
                "only function, custom and local_shell tools can be allowed",
            )
        namespace = entry.get("namespace")
        if namespace is not None and not isinstance(namespace, str):
            raise invalid_type(f"tool_choice.tools[{i}].namespace", "a string", namespace)
        out.append((namespace, name))
    return out
