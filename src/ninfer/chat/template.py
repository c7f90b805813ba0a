"""Chat-template rendering: a sandboxed Jinja template turns messages into a prompt string or ids.

Imports jinja2 and the standard library only (no torch); the tokenizer is duck-typed.
`render_ids` escapes every "<" in caller strings before rendering, so every special-token
spelling in the output was written by the template; escaping "<" rather than whole spellings
also stops caller text from completing one with template text ("x<|im_end|" + template ">").
"""

from __future__ import annotations

import importlib.resources
import json
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Protocol

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = [
    "DEFAULT_TEMPLATE_NAME",
    "ChatTemplate",
    "TemplateError",
    "TemplateTokenizer",
    "load_default_template",
]

DEFAULT_TEMPLATE_NAME = "qwen3_5"

# Caller strings reach the template with "<" written as _ESC + "1" and _ESC itself as _ESC + "0".
# _ESC is the last private-use code point; neither it nor "0"/"1" is whitespace, so the template's
# trim/strip/split calls cannot cut an escape pair apart.
_ESC = "\U0010fffd"
_ESCAPES = {"<": _ESC + "1", _ESC: _ESC + "0"}
_UNESCAPES = {"1": "<", "0": _ESC}
_ESCAPE_RE = re.compile(f"[<{_ESC}]")
_UNESCAPE_RE = re.compile(f"{_ESC}(.?)", re.DOTALL)

# Names the template sees that template kwargs must not shadow.
_RESERVED_NAMES = frozenset({"messages", "tools", "add_generation_prompt"})


class TemplateError(Exception):
    """The template failed to compile or render, or the messages are not renderable."""


class TemplateTokenizer(Protocol):
    """What `render_ids` needs from a tokenizer (ninfer.tokenizer.Tokenizer provides it)."""

    @property
    def special_tokens(self) -> Mapping[str, int]: ...

    def encode_text(self, text: str) -> list[int]: ...


def load_default_template() -> str:
    """The packaged ninfer template for the Qwen3.5 family."""
    resource = (
        importlib.resources.files("ninfer.chat") / "templates" / f"{DEFAULT_TEMPLATE_NAME}.jinja"
    )
    return resource.read_text(encoding="utf-8")


class ChatTemplate:
    """A compiled chat template.

    The Jinja environment matches Hugging Face's `apply_chat_template` (sandboxed, trim_blocks,
    lstrip_blocks, loop controls, a `tojson` that keeps non-ASCII text and key order), so a
    template renders the same string here as there.
    """

    def __init__(self, source: str) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(
                _one_line(f"chat template does not compile (line {exc.lineno}): {exc.message}")
            ) from exc
        self.source = source

    def render(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The prompt as text; control-token spellings inside messages are indistinguishable.

        Use `render_ids` to build model input: there quoted control tokens stay plain text.
        """
        messages = _parse_tool_arguments(_check_messages(messages))
        return self._render(messages, tools, add_generation_prompt, template_kwargs)

    def render_ids(
        self,
        tokenizer: TemplateTokenizer,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        """The prompt as token ids; only the template's own structure yields special-token ids.

        Caller strings (contents, reasoning, tool names, arguments, results, tool definitions
        and string kwargs) are escaped before rendering, so template logic that looks for
        control-token spellings inside them (e.g. reasoning inlined as "<think>...</think>" in
        assistant content) sees plain text and leaves it as text.
        """
        messages = _parse_tool_arguments(_check_messages(messages))
        text = self._render(
            _escape(messages), _escape(tools), add_generation_prompt, _escape(template_kwargs)
        )
        specials = _special_tokens(tokenizer)
        ids: list[int] = []
        pos = 0
        for match in _special_pattern(tuple(specials)).finditer(text):
            if match.start() > pos:
                ids += tokenizer.encode_text(_unescape(text[pos : match.start()]))
            ids.append(specials[match.group()])
            pos = match.end()
        if pos < len(text):
            ids += tokenizer.encode_text(_unescape(text[pos:]))
        return ids

    def _render(
        self,
        messages: list[dict],
        tools: list[dict] | None,
        add_generation_prompt: bool,
        template_kwargs: dict[str, Any],
    ) -> str:
        shadowed = sorted(_RESERVED_NAMES.union(_environment().globals) & set(template_kwargs))
        if shadowed:
            raise TemplateError(f"template kwargs may not override {', '.join(shadowed)}")
        try:
            return self._template.render(
                messages=messages,
                tools=tools,
                add_generation_prompt=add_generation_prompt,
                **template_kwargs,
            )
        except TemplateError:
            raise
        # Bad message shapes surface as Python errors inside template expressions
        # (e.g. str + int, `items` on a non-mapping); report them all the same way.
        except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError) as exc:
            raise TemplateError(_one_line(f"chat template failed: {exc}")) from exc


def _raise_exception(message: str) -> None:
    raise TemplateError(_one_line(str(message)))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes and sorts keys; chat templates expect neither.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    return env


def _one_line(message: str) -> str:
    return " ".join(message.split())


def _check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
        raise TemplateError("messages must be a list of dicts")
    return messages


def _parse_tool_arguments(messages: list[dict]) -> list[dict]:
    """Copy of `messages` with JSON-text tool-call arguments parsed into (ordered) objects.

    OpenAI-style clients send arguments as JSON text while templates iterate them as mappings.
    Empty text means no arguments.
    """
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if isinstance(calls, list) and any(_has_text_arguments(call) for call in calls):
            message = {**message, "tool_calls": [_parsed_call(call) for call in calls]}
        out.append(message)
    return out


def _has_text_arguments(call: Any) -> bool:
    if not isinstance(call, Mapping):
        return False
    fn = call.get("function", call)
    return isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str)


def _parsed_call(call: Any) -> Any:
    if not _has_text_arguments(call):
        return call
    nested = isinstance(call.get("function"), Mapping)
    fn = call["function"] if nested else call
    text = fn["arguments"]
    try:
        arguments = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise TemplateError(f"tool call {fn.get('name')!r}: arguments are not valid JSON") from exc
    if not isinstance(arguments, dict):
        raise TemplateError(f"tool call {fn.get('name')!r}: arguments must be a JSON object")
    fn = {**fn, "arguments": arguments}
    return {**call, "function": fn} if nested else fn


def _escape(value: Any) -> Any:
    """`value` with "<" (and the escape character) escaped in every string and dict key."""
    if isinstance(value, str):
        return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group()], value)
    if isinstance(value, Mapping):
        return {_escape(key): _escape(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_escape(item) for item in value]
    return value


def _unescape(text: str) -> str:
    def restore(match: re.Match[str]) -> str:
        original = _UNESCAPES.get(match.group(1))
        if original is None:
            # Only a template that slices strings by position could split an escape pair.
            raise TemplateError("chat template cut an escaped character apart")
        return original

    return _UNESCAPE_RE.sub(restore, text)


def _special_tokens(tokenizer: TemplateTokenizer) -> Mapping[str, int]:
    specials = tokenizer.special_tokens
    # Accept a method as well as a property.
    return specials() if callable(specials) else specials


@lru_cache(maxsize=8)
def _special_pattern(spellings: tuple[str, ...]) -> re.Pattern[str]:
    # Longest first, so a spelling wins over any spelling it contains.
    ordered = sorted(spellings, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, ordered)) or "(?!)")
