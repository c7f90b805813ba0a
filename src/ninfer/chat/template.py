"""Chat-template rendering: a sandboxed Jinja template turns messages into a prompt string or ids.

Imports jinja2 and the standard library only (no torch); the tokenizer is duck-typed.
`render_ids` escapes every "<" in caller strings before rendering, so every special-token
spelling in the output was written by the template; escaping "<" rather than whole spellings
also stops caller text from completing one with template text ("x<|im_end|" + template ">").
`render_ids_marked` finds the token offsets of boundaries inside message contents (prompt-cache
markers) by rendering once more with sentinels only the escape scheme can produce.
"""

from __future__ import annotations

import importlib.resources
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = [
    "DEFAULT_TEMPLATE_NAME",
    "ChatTemplate",
    "ContentMark",
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
# A content mark rides through rendering as _ESC + "2" + chr(_MARK_BASE + its index): escaped
# caller text never holds _ESC + "2", so every sentinel in the output is one of ours.
_MARK_BASE = 0xE000
_MARK_RE = re.compile(f"{_ESC}2(.)", re.DOTALL)

# Names the template sees that template kwargs must not shadow.
_RESERVED_NAMES = frozenset({"messages", "tools", "add_generation_prompt"})


@dataclass(frozen=True)
class ContentMark:
    """A boundary inside message `message`'s content: after its first `offset` characters, or,
    with None, at the end of its text (trailing whitespace excluded: the template trims it).
    `message=TOOLS` is the end of the tool declarations."""

    message: int
    offset: int | None = None


TOOLS = -1  # ContentMark.message of "after the tool declarations"
_CLOSE = "<|im_end|>"


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
        ids, _ = self.render_ids_marked(
            tokenizer,
            messages,
            (),
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            **template_kwargs,
        )
        return ids

    def render_ids_marked(
        self,
        tokenizer: TemplateTokenizer,
        messages: list[dict],
        marks: Sequence[ContentMark],
        *,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> tuple[list[int], list[int | None]]:
        """`render_ids`, plus the token offset of each mark (None where the boundary is not a
        token boundary of the real prompt, or rendering cannot place it: it is then ignored,
        and the prompt never changes because of a mark)."""
        messages = _parse_tool_arguments(_check_messages(messages))
        escaped = (_escape(messages), _escape(tools), _escape(template_kwargs))
        text = self._render(escaped[0], escaped[1], add_generation_prompt, escaped[2])
        positions: list[int | None] = [None] * len(marks)
        marks = [_tools_mark(m, messages, tools) for m in marks]
        for i, mark in enumerate(marks):
            if mark is not None and mark.message == TOOLS:  # the tools-only opening turn
                end = text.find(_CLOSE)
                positions[i] = end if end >= 0 else None
        marks = [m if m is not None and m.message != TOOLS else ContentMark(-2) for m in marks]
        if marks:
            found = self._mark_positions(messages, escaped, add_generation_prompt, marks, text)
            if found is None and len(marks) > 1:  # one mark disturbed rendering: try each alone
                found = {}
                for i, mark in enumerate(marks):
                    one = self._mark_positions(
                        messages, escaped, add_generation_prompt, [mark], text
                    )
                    if one:
                        found[i] = one[0]
            for i, pos in (found or {}).items():
                if positions[i] is None:
                    positions[i] = pos
        return _tokenize(tokenizer, text, positions)

    def _mark_positions(
        self,
        messages: list[dict],
        escaped: tuple[Any, Any, Any],
        add_generation_prompt: bool,
        marks: Sequence[ContentMark],
        text: str,
    ) -> dict[int, int] | None:
        """Character positions of the marks in `text`, or None when the sentinels changed what
        the template rendered (e.g. a check on how a content ends)."""
        cuts: list[tuple[int, int, int]] = []  # (message, character, mark index)
        for i, mark in enumerate(marks):
            if not 0 <= mark.message < len(messages):
                continue
            content = messages[mark.message].get("content")
            if not isinstance(content, str):
                continue  # NOTE: marks inside multi-part contents (media) are not placed yet
            cut = len(content) if mark.offset is None else mark.offset
            if not 0 <= cut <= len(content):
                continue
            if not content[cut:].strip():  # only whitespace follows: the template trims it
                cut = len(content[:cut].rstrip())
            cuts.append((mark.message, cut, i))
        if not cuts:
            return {}
        marked = [dict(m) for m in escaped[0]]
        for message, cut, i in sorted(cuts, reverse=True):  # later cuts first: no shifting
            before = marked[message]["content"]
            index = _escaped_length(messages[message]["content"], cut)
            sentinel = _ESC + "2" + chr(_MARK_BASE + i)
            marked[message]["content"] = before[:index] + sentinel + before[index:]
        rendered = self._render(marked, escaped[1], add_generation_prompt, escaped[2])
        found: dict[int, int] = {}
        pieces: list[str] = []
        pos = length = 0
        for match in _MARK_RE.finditer(rendered):
            pieces.append(rendered[pos : match.start()])
            length += match.start() - pos
            index = ord(match.group(1)) - _MARK_BASE
            if index in found:  # the template rendered this content twice: ambiguous
                return None
            found[index] = length
            pos = match.end()
        pieces.append(rendered[pos:])
        if "".join(pieces) != text:
            return None
        return found

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


def _tools_mark(
    mark: ContentMark, messages: list[dict], tools: list[dict] | None
) -> ContentMark | None:
    """Where "after the tools" lies in ninfer's Qwen3.5 template: the declarations open the
    system turn, followed by a leading system / developer message's text when there is one
    (its start), else by the turn's closing token."""
    if mark.message != TOOLS:
        return mark
    if not tools:
        return None
    if messages and messages[0].get("role") in ("system", "developer"):
        return ContentMark(0, 0)
    return mark


def _escaped_length(content: str, cut: int) -> int:
    """Length of `_escape(content[:cut])`: where position `cut` lands in the escaped string."""
    return cut + len(_ESCAPE_RE.findall(content[:cut]))


def _tokenize(
    tokenizer: TemplateTokenizer, text: str, positions: Sequence[int | None]
) -> tuple[list[int], list[int | None]]:
    """Token ids of rendered `text` (special-token spellings are the template's own), and the
    token offset of each character position: exact at a special token, and inside a text run
    only where encoding the run's prefix gives a prefix of the run's ids."""
    specials = _special_tokens(tokenizer)
    ids: list[int] = []
    offsets: list[int | None] = [None] * len(positions)
    pending = {i: p for i, p in enumerate(positions) if p is not None}

    def text_run(start: int, end: int) -> None:
        run = tokenizer.encode_text(_unescape(text[start:end]))
        for i, p in list(pending.items()):
            if p == start:
                offsets[i] = len(ids)
            elif start < p < end:
                head = tokenizer.encode_text(_unescape(text[start:p]))
                if run[: len(head)] == head:
                    offsets[i] = len(ids) + len(head)
            else:
                continue
            del pending[i]
        ids.extend(run)

    pos = 0
    for match in _special_pattern(tuple(specials)).finditer(text):
        if match.start() > pos:
            text_run(pos, match.start())
        for i, p in list(pending.items()):
            if p == match.start():
                offsets[i] = len(ids)
                del pending[i]
        ids.append(specials[match.group()])
        pos = match.end()
    if pos < len(text):
        text_run(pos, len(text))
    for i, p in pending.items():
        if p == len(text):
            offsets[i] = len(ids)
    return ids, offsets


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
