"""OpenAI Chat Completions request parsing: JSON body -> `ChatCompletionRequest` or ProtocolError.

Imports the standard library and `protocol.errors` only: no sanic, no torch, no engine (rendering
lives in `openai_chat_render`). Parsing is strict where the engine cannot honour a request (each
rejection names the field and the lost guarantee) and lenient where a field is semantically neutral
or unknown (ignored), so real SDK payloads run unchanged. Messages come out template-ready.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ninfer.protocol.errors import (
    conflicting_template_option,
    invalid,
    invalid_type,
    missing_or_type,
    opt_bool,
    unsupported,
)
from ninfer.protocol.media_parts import joined, openai_url_part, text_length, text_part

MAX_STOP_STRINGS = 4
TOP_K_MAX = 20
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 63) - 1
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# Template names a request may not set through chat_template_kwargs: the conversation, the
# generation mode and the tokenizer's special tokens belong to the server.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
        "bos_token",
        "eos_token",
        "pad_token",
        "unk_token",
    }
)
# Constrained-decoding aliases from other servers: rejected explicitly, never ignored as unknown.
CONSTRAINED_ALIASES = (
    "grammar",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)
_NO_CONSTRAINT = "ninfer has no constrained decoding, so the output cannot be guaranteed to match"


@dataclass(frozen=True)
class ChatCompletionRequest:
    """A validated request; `None` fields were not given (server defaults apply)."""

    model: str
    messages: list[dict[str, Any]]  # template-ready: roles system/developer/user/assistant/tool
    tools: list[dict[str, Any]] | None = None  # the effective tools (after tool_choice)
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # engine SamplingParams names
    stop: tuple[str, ...] = ()
    enable_thinking: bool | None = None
    preserve_thinking: bool | None = None
    reasoning_effort: str | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # without the three above
    return_progress: bool = False
    timings_per_token: bool = False
    ignore_eos: bool = False  # vLLM's extension: generate to max_tokens through end-of-turn
    # prompt caching: explicit breakpoints as (message index, characters of its content before
    # the boundary), and whether the automatic candidate is written (prompt_cache_options.mode)
    cache_marks: tuple[tuple[int, int], ...] = ()
    cache_implicit: bool = True

    def template_options(
        self, *, default_thinking: bool, default_preserve: bool
    ) -> TemplateOptions:
        """Request fields override the server's --no-thinking / --preserve-thinking defaults."""
        thinking = self.enable_thinking
        if thinking is None and self.reasoning_effort is not None:
            thinking = self.reasoning_effort != "none"
        if thinking is None:
            thinking = default_thinking
        kwargs = dict(self.template_kwargs)
        preserve = default_preserve if self.preserve_thinking is None else self.preserve_thinking
        if preserve:
            kwargs["preserve_thinking"] = True
        if self.reasoning_effort is not None:
            kwargs["reasoning_effort"] = self.reasoning_effort
        return TemplateOptions(thinking, kwargs)


class TemplateOptions(NamedTuple):
    enable_thinking: bool
    kwargs: dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Request parsing
# ---------------------------------------------------------------------------------------------


def parse_chat_request(body: Any) -> ChatCompletionRequest:
    """Validate a decoded JSON body; raise ProtocolError (HTTP 400) naming the first bad field."""
    if not isinstance(body, dict):
        raise invalid_type("body", "a JSON object", body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise missing_or_type(body, "model", "a non-empty string")
    _reject_unsupported(body)
    marks: list[tuple[int, int]] = []
    messages = _parse_messages(body.get("messages"), marks)
    stream = opt_bool(body, "stream") or False
    include_usage = False
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise invalid_type("stream_options", "an object", options)
        if not stream:
            raise invalid("stream_options", "is only allowed when stream is true")
        include_usage = opt_bool(options, "include_usage", "stream_options.") or False
    enable, preserve, effort, kwargs = parse_template_options(body)
    return ChatCompletionRequest(
        model=model,
        messages=messages,
        tools=_parse_tools(body),
        stream=stream,
        include_usage=include_usage,
        max_tokens=_parse_max_tokens(body),
        sampling=_parse_sampling(body),
        stop=_parse_stop(body.get("stop")),
        enable_thinking=enable,
        preserve_thinking=preserve,
        reasoning_effort=effort,
        template_kwargs=kwargs,
        return_progress=opt_bool(body, "return_progress") or False,
        timings_per_token=opt_bool(body, "timings_per_token") or False,
        ignore_eos=opt_bool(body, "ignore_eos") or False,
        cache_marks=tuple(marks),
        cache_implicit=cache_implicit(body),
    )


def cache_implicit(body: Mapping[str, Any]) -> bool:
    """prompt_cache_options.mode: omitted or "implicit" writes the automatic candidate,
    "explicit" only the request's breakpoints (spec: OpenAI prompt caching)."""
    options = body.get("prompt_cache_options")
    if options is None:
        return True
    if not isinstance(options, dict):
        raise invalid_type("prompt_cache_options", "an object", options)
    mode = options.get("mode", "implicit")
    if mode not in ("implicit", "explicit"):
        raise invalid("prompt_cache_options.mode", "must be 'implicit' or 'explicit'")
    return mode == "implicit"


def check_breakpoint(param: str, part: Mapping[str, Any]) -> bool:
    """Whether a content part carries prompt_cache_breakpoint:{"mode":"explicit"}."""
    marker = part.get("prompt_cache_breakpoint")
    if marker is None:
        return False
    if not isinstance(marker, dict) or marker.get("mode") != "explicit":
        raise invalid(f"{param}.prompt_cache_breakpoint", "must be {'mode': 'explicit'}")
    return True


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


VLLM_EXTRAS = (
    ("min_tokens", (0,), "a minimum output length is not enforced by the sampler"),
    ("best_of", (1,), "only one candidate is generated (best_of: 1)"),
    ("use_beam_search", (False,), "beam search is not supported"),
    ("include_stop_str_in_output", (False,), "the matched stop string is never in the output"),
)


def _reject_unsupported(body: Mapping[str, Any]) -> None:
    """Fields whose requested behaviour the engine cannot provide; neutral values pass."""
    n = body.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n != 1):
        raise unsupported(
            "n", "only n=1 is supported (one choice per request)", "unsupported_value"
        )
    modalities = body.get("modalities")
    if modalities is not None:
        if not isinstance(modalities, list) or any(not isinstance(m, str) for m in modalities):
            raise invalid_type("modalities", "an array of strings", modalities)
        if any(m != "text" for m in modalities):
            raise unsupported("modalities", "only text output is supported", "unsupported_value")
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise invalid_type("response_format", "an object", fmt)
        if fmt.get("type") != "text":
            raise unsupported("response_format", f"only type 'text' is supported; {_NO_CONSTRAINT}")
    for name in CONSTRAINED_ALIASES:
        if body.get(name) is not None:
            raise unsupported(name, f"{_NO_CONSTRAINT} a grammar, schema, regex or choice")
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict) or not all(_is_number(v) for v in bias.values()):
            raise invalid_type("logit_bias", "an object of token ids to numbers", bias)
        if any(v != 0 for v in bias.values()):
            raise unsupported("logit_bias", "token logit biases are not applied by the sampler")
    if body.get("logprobs") not in (None, False):
        raise unsupported("logprobs", "log probabilities are not returned")
    top = body.get("top_logprobs")
    if top is not None and top != 0:
        raise unsupported("top_logprobs", "log probabilities are not returned")
    audio = body.get("audio")
    if audio is not None and not isinstance(audio, dict):
        raise invalid_type("audio", "an object", audio)
    if body.get("web_search_options") is not None:
        raise unsupported("web_search_options", "ninfer has no web search tool")
    if body.get("moderation") is not None:
        raise unsupported("moderation", "ninfer does not run hosted moderation")
    verbosity = body.get("verbosity")
    if verbosity not in (None, "medium"):
        raise unsupported("verbosity", "only 'medium' is supported; output length is not steered")
    if body.get("store") not in (None, False):
        raise unsupported("store", "Chat Completions are not stored by this server")
    penalty = body.get("repetition_penalty")
    if penalty is not None and penalty != 1:
        raise unsupported("repetition_penalty", "only the neutral value 1 is supported")
    # vLLM's sampling extensions: their neutral values pass, anything else would be ignored
    for name, neutral, why in VLLM_EXTRAS:
        if body.get(name) not in (None, *neutral):
            raise unsupported(name, why)
    mm = body.get("mm_processor_kwargs")
    if mm is not None and (not isinstance(mm, dict) or any(v is not None for v in mm.values())):
        raise unsupported("mm_processor_kwargs", "media processing options are not supported")
    functions = body.get("functions")
    if functions is not None and functions != []:
        raise unsupported("functions", "legacy functions are not supported; use tools")
    if body.get("function_call") not in (None, "none", "auto"):
        raise unsupported("function_call", "legacy forced function calls are not supported")


def _parse_max_tokens(body: Mapping[str, Any]) -> int | None:
    values = {}
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise invalid(name, f"must be a non-negative integer, got {value!r}")
        values[name] = value
    if len(set(values.values())) > 1:
        raise invalid("max_tokens", "max_tokens and max_completion_tokens disagree")
    return next(iter(values.values()), None)


def _parse_sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    ranges = {
        "temperature": (0.0, 2.0),
        "top_p": (0.0, 1.0),
        "min_p": (0.0, 1.0),
        "presence_penalty": (-2.0, 2.0),
        "frequency_penalty": (-2.0, 2.0),
    }
    out: dict[str, Any] = {}
    for name, (low, high) in ranges.items():
        value = body.get(name)
        if value is None:
            continue
        if not _is_number(value) or not math.isfinite(value) or not low <= value <= high:
            raise invalid(name, f"must be a finite number in [{low:g}, {high:g}], got {value!r}")
        out[name] = float(value)
    for name, (low, high) in {"top_k": (0, TOP_K_MAX), "seed": (SEED_MIN, SEED_MAX)}.items():
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise invalid(name, f"must be an integer in {low}..{high}, got {value!r}")
        out[name] = value
    return out


def _parse_stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise invalid_type("stop", "a string or an array of strings", stop)
    if len(items) > MAX_STOP_STRINGS:
        raise invalid("stop", f"at most {MAX_STOP_STRINGS} stop strings are supported")
    if any(not s for s in items):
        raise invalid("stop", "stop strings must be non-empty")
    return tuple(items)


def template_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the request's chat_template_kwargs, refusing the names the server sets."""
    raw = body.get("chat_template_kwargs")
    if raw is not None and not isinstance(raw, dict):
        raise invalid_type("chat_template_kwargs", "an object", raw)
    kwargs = dict(raw or {})
    for name in kwargs:
        if name in RESERVED_TEMPLATE_KWARGS:
            raise invalid(
                f"chat_template_kwargs.{name}",
                "is set by the server (messages, tools, generation mode and special tokens "
                "cannot be overridden)",
            )
    return kwargs


def merge_template_option(
    body: Mapping[str, Any],
    kwargs: dict[str, Any],
    name: str,
    check: Callable[[str, Any], None],
) -> Any:
    """A template option given at the top level, inside chat_template_kwargs (popped from
    `kwargs`), or in both with the same value; each given value is checked first."""
    top, inner = body.get(name), kwargs.pop(name, None)
    for param, value in ((name, top), (f"chat_template_kwargs.{name}", inner)):
        if value is not None:
            check(param, value)
    if top is not None and inner is not None and top != inner:
        raise conflicting_template_option(f"{name} and chat_template_kwargs.{name} disagree")
    return top if top is not None else inner


def check_bool(param: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise invalid_type(param, "a boolean", value)


def parse_template_options(
    body: Mapping[str, Any],
) -> tuple[bool | None, bool | None, str | None, dict[str, Any]]:
    kwargs = template_kwargs(body)

    def is_effort(param: str, value: Any) -> None:
        if value not in REASONING_EFFORTS:
            raise invalid(param, f"must be one of {', '.join(REASONING_EFFORTS)}, got {value!r}")

    enable = merge_template_option(body, kwargs, "enable_thinking", check_bool)
    preserve = merge_template_option(body, kwargs, "preserve_thinking", check_bool)
    effort = merge_template_option(body, kwargs, "reasoning_effort", is_effort)
    if enable is True and effort == "none":
        raise conflicting_template_option("enable_thinking is true but reasoning_effort is 'none'")
    if enable is False and effort not in (None, "none"):
        raise conflicting_template_option(
            f"enable_thinking is false but reasoning_effort is {effort!r}"
        )
    return enable, preserve, effort, kwargs


# -- tools ------------------------------------------------------------------------------------


def _parse_tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise invalid_type("tools", "an array", tools)
    for i, tool in enumerate(tools):
        _check_tool(f"tools[{i}]", tool)
    effective = _apply_tool_choice(tools, body.get("tool_choice"))
    if effective and body.get("parallel_tool_calls") is False:
        raise unsupported(
            "parallel_tool_calls", "false cannot be enforced: the model may emit several calls"
        )
    return effective or None


def _check_tool(param: str, tool: Any) -> None:
    if not isinstance(tool, dict):
        raise invalid_type(param, "an object", tool)
    if tool.get("type") != "function":
        raise unsupported(
            f"{param}.type", "only function tools are supported (no hosted or custom tools)"
        )
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise invalid_type(f"{param}.function", "an object", fn)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_type(f"{param}.function.name", "a non-empty string", name)
    if fn.get("strict") not in (None, False):
        raise unsupported(
            f"{param}.function.strict",
            f"strict schemas need constrained decoding; {_NO_CONSTRAINT}",
        )
    params = fn.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise invalid_type(f"{param}.function.parameters", "an object", params)
    desc = fn.get("description")
    if desc is not None and not isinstance(desc, str):
        raise invalid_type(f"{param}.function.description", "a string", desc)


def _apply_tool_choice(tools: list[dict[str, Any]], choice: Any) -> list[dict[str, Any]]:
    """The tools the model may call. `none` removes them from the prompt and the parser."""
    if choice is None or choice == "auto":
        return tools
    if choice == "none":
        return []
    if choice == "required":
        raise unsupported(
            "tool_choice", "'required' needs constrained decoding to guarantee a call"
        )
    if not isinstance(choice, dict):
        raise invalid("tool_choice", f"must be 'auto', 'none' or an object, got {choice!r}")
    if choice.get("type") != "allowed_tools":
        raise unsupported("tool_choice", "a named tool choice needs constrained decoding")
    allowed = choice.get("allowed_tools")
    if not isinstance(allowed, dict):
        raise invalid_type("tool_choice.allowed_tools", "an object", allowed)
    if allowed.get("mode") != "auto":
        raise unsupported("tool_choice.allowed_tools.mode", "only mode 'auto' is supported")
    entries = allowed.get("tools")
    if not isinstance(entries, list):
        raise invalid_type("tool_choice.allowed_tools.tools", "an array", entries)
    names = set()
    for i, entry in enumerate(entries):
        fn = entry.get("function") if isinstance(entry, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or entry.get("type") != "function":
            raise invalid(f"tool_choice.allowed_tools.tools[{i}]", "must name a function tool")
        names.add(name)
    return [t for t in tools if t["function"]["name"] in names]


# -- messages ---------------------------------------------------------------------------------


def _parse_messages(messages: Any, marks: list[tuple[int, int]]) -> list[dict[str, Any]]:
    if messages is None:
        raise invalid("messages", "is required", code="missing_required_parameter")
    if not isinstance(messages, list):
        raise invalid_type("messages", "an array", messages)
    if not messages:
        raise invalid("messages", "must contain at least one message")
    out = []
    for i, m in enumerate(messages):
        offsets: list[int] = []
        out.append(_parse_message(f"messages[{i}]", m, offsets))
        marks += [(i, offset) for offset in offsets]
    return out


def _parse_message(param: str, message: Any, marks: list[int]) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise invalid_type(param, "an object", message)
    role = message.get("role")
    if role == "function":  # legacy function result
        name = message.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_type(f"{param}.name", "a non-empty string", name)
        return {"role": "tool", "content": _text(f"{param}.content", message.get("content"))}
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise invalid(f"{param}.role", f"unknown role {role!r}")
    name = message.get("name")
    if role == "tool":
        if name is not None and not isinstance(name, str):
            raise invalid_type(f"{param}.name", "a string", name)
    elif name is not None and name != "":
        if not isinstance(name, str):
            raise invalid_type(f"{param}.name", "a string", name)
        raise unsupported(
            f"{param}.name", "participant names cannot be represented by the chat template"
        )
    if role == "assistant":
        return _parse_assistant(param, message, marks)
    out: dict[str, Any] = {
        "role": role,
        "content": _text(
            f"{param}.content", message.get("content"), media=role in ("user", "tool"), marks=marks
        ),
    }
    if role == "tool":
        call_id = message.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise invalid_type(f"{param}.tool_call_id", "a string", call_id)
        if call_id is not None:
            out["tool_call_id"] = call_id
    return out


def _parse_assistant(param: str, message: Mapping[str, Any], marks: list[int]) -> dict[str, Any]:
    content = str(_text(f"{param}.content", message.get("content"), refusal=True, marks=marks))
    refusal = message.get("refusal")
    if refusal is not None:
        if not isinstance(refusal, str):
            raise invalid_type(f"{param}.refusal", "a string", refusal)
        content += refusal
    if message.get("audio") is not None:
        raise unsupported(f"{param}.audio", "audio history is not supported")
    out: dict[str, Any] = {"role": "assistant", "content": content}
    for alias in ("reasoning_content", "reasoning"):
        reasoning = message.get(alias)
        if reasoning is None:
            continue
        if not isinstance(reasoning, str):
            raise invalid_type(f"{param}.{alias}", "a string", reasoning)
        out["reasoning_content"] = reasoning
        break
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise invalid_type(f"{param}.tool_calls", "an array", calls)
        parsed = [_parse_call(f"{param}.tool_calls[{i}]", c) for i, c in enumerate(calls)]
        if parsed:
            out["tool_calls"] = parsed
    legacy = message.get("function_call")
    if legacy is not None:
        call = _parse_function(f"{param}.function_call", legacy)
        out.setdefault("tool_calls", []).append({"type": "function", "function": call})
    return out


def _parse_call(param: str, call: Any) -> dict[str, Any]:
    if not isinstance(call, dict):
        raise invalid_type(param, "an object", call)
    if call.get("type", "function") != "function":
        raise unsupported(f"{param}.type", "only function tool calls are supported")
    out: dict[str, Any] = {
        "type": "function",
        "function": _parse_function(param + ".function", call.get("function")),
    }
    call_id = call.get("id")
    if call_id is not None:
        if not isinstance(call_id, str):
            raise invalid_type(f"{param}.id", "a string", call_id)
        out = {"id": call_id, **out}
    return out


def _parse_function(param: str, fn: Any) -> dict[str, Any]:
    if not isinstance(fn, dict):
        raise invalid_type(param, "an object", fn)
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise invalid_type(f"{param}.name", "a non-empty string", name)
    arguments = fn.get("arguments", "")
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            raise invalid(f"{param}.arguments", "is not valid JSON") from None
        if not isinstance(value, dict):
            raise invalid(f"{param}.arguments", "must encode a JSON object")
    elif not isinstance(arguments, dict):
        raise invalid_type(f"{param}.arguments", "a JSON object string", arguments)
    return {"name": name, "arguments": arguments}


def _text(
    param: str,
    content: Any,
    *,
    media: bool = False,
    refusal: bool = False,
    marks: list[int] | None = None,
) -> str | list[dict[str, str]]:
    """Message content: one string (parts join without separators, null is an empty turn), or,
    when it holds image / video parts, the ordered list of template parts. A part's
    prompt_cache_breakpoint adds the length of the text up to its end to `marks`."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid_type(param, "a string or an array of content parts", content)
    parts: list[dict[str, str]] = []
    for i, part in enumerate(content):
        where = f"{param}[{i}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict) or not isinstance(kind, str):
            raise invalid(where, "must be a content part object with a type")
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise invalid_type(f"{where}.text", "a string", text)
            parts.append(text_part(text))
            if check_breakpoint(where, part) and marks is not None:
                marks.append(text_length(parts))
        elif kind == "refusal" and refusal:
            text = part.get("refusal")
            if not isinstance(text, str):
                raise invalid_type(f"{where}.refusal", "a string", text)
            parts.append(text_part(text))
        elif kind in ("image_url", "video_url") and media:
            media_kind = "image" if kind == "image_url" else "video"
            parts.append(openai_url_part(f"{where}.{kind}", media_kind, part.get(kind)))
        elif kind in ("input_audio", "file", "image_url", "video_url", "refusal"):
            raise unsupported(where, f"{kind} content is not supported in this message role")
        else:
            raise invalid(f"{where}.type", f"unknown content part type {kind!r}")
    return joined(parts)
