"""Qwen output decoder: committed text in; reasoning, content and structured tool calls out.

Owns the `<think>` / `<tool_call>` markup of Qwen3.5 output and the per-request tool-call parse
diagnostics. Imports only the standard library and chat.tool_schema (never torch). Markers are
recognised by their spelling in the text (the detokenizer spells the special tokens), so one path
serves streaming and aggregate output: plain text is released at once, a tool region is held until
it is proven (structured calls at end of output) or disproven (released verbatim as text).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ninfer.chat.tool_schema import ToolCatalog, coerce_parameter

__all__ = [
    "DeltaKind",
    "FallbackReason",
    "OutputDecoder",
    "OutputDecoderError",
    "OutputDelta",
    "ToolCall",
    "ToolCallParseStats",
]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"

# A name longer than this is not a name; the bound also caps how long a prose mention is held.
MAX_NAME_CHARS = 256
_STRUCT_SPACE = re.compile(r"[ \t\r\n]*")
_NAME_RUN = re.compile(r"[^\s<>]*")


class DeltaKind(enum.Enum):
    REASONING = "reasoning"
    CONTENT = "content"
    TOOL_CALL = "tool_call"


class FallbackReason(enum.StrEnum):
    """Why tool markup was returned to text (the spec's stable diagnostic values)."""

    NONE = "none"
    MALFORMED_STRUCTURE = "malformed_structure"
    DUPLICATE_PARAMETER = "duplicate_parameter"
    INVALID_TOOL_NAME = "invalid_tool_name"
    UNDECLARED_TOOL = "undeclared_tool"
    TRAILING_CONTENT = "trailing_content"


@dataclass(frozen=True)
class ToolCall:
    """A structured call; `arguments` is JSON object text in the model's parameter order."""

    index: int
    name: str
    arguments: str


@dataclass(frozen=True)
class OutputDelta:
    kind: DeltaKind
    text: str = ""
    tool_call: ToolCall | None = None


@dataclass
class ToolCallParseStats:
    """request_done.result.tool_call_parse; counts only, never arguments or generated text.

    `fallback_reason` keeps the first fallback of the request; the counters cover structured calls.
    """

    marker_seen: bool = False
    num_calls: int = 0
    num_empty_omitted: int = 0
    num_mismatched_preserved: int = 0
    fallback_reason: FallbackReason = FallbackReason.NONE


class OutputDecoderError(RuntimeError):
    """The decoder was used after finish()."""


class _State(enum.Enum):
    OPEN = enum.auto()  # after <tool_call>: expect <function=
    FUNCTION_NAME = enum.auto()
    FUNCTION_BODY = enum.auto()  # expect <parameter= or </function>
    PARAMETER_NAME = enum.auto()
    PARAMETER_VALUE = enum.auto()
    AFTER_FUNCTION = enum.auto()  # expect </tool_call>
    AFTER_CALL = enum.auto()  # expect another <tool_call>, </think> (in reasoning) or the end


class _Failed(NamedTuple):
    reason: FallbackReason
    cut: int  # region text before `cut` becomes plain text; scanning resumes at `cut`


class _Signal(enum.Enum):
    NEED = enum.auto()  # more text is needed to decide
    ACCEPTED = enum.auto()  # the region is complete and the output has ended
    MISMATCH = enum.auto()  # the expected token is not there


_Outcome = _Signal | _Failed | None  # None: a transition was made, keep stepping


class _ToolRegion:
    """Incremental parser of one run of consecutive tool calls starting at offset 0 of a buffer.

    The buffer only grows while the region is open, so the cursor never rescans resolved text.
    Grammar (whitespace `_` between structural tokens is free):
        region := call (_ call | _ </think>)* _ END
        call   := <tool_call> _ <function=NAME> (_ <parameter=NAME>VALUE</parameter>)* _
                  </function> _ </tool_call>
    A VALUE is raw bytes in which `<parameter=` / `</parameter>` must balance (the wire format has
    no escape), so nested markup is preserved and anything ambiguous fails the whole region.
    """

    def __init__(self, catalog: ToolCatalog, *, reasoning_open: bool) -> None:
        self.reasoning_open = reasoning_open
        self.calls: list[tuple[str, dict[str, str]]] = []
        self._catalog = catalog
        self._state = _State.OPEN
        self._pos = len(TOOL_CALL_OPEN)
        self._mark = 0  # start of the name or value being read
        self._scan = 0  # parameter value: everything before this is known free of markers
        self._depth = 0  # parameter value: open nested <parameter= count
        self._name = ""
        self._params: dict[str, str] = {}
        self._param = ""

    def advance(self, buf: str, final: bool) -> _Signal | _Failed:
        """Return NEED, ACCEPTED (only when final) or a _Failed."""
        while True:
            result = self._step(buf, final)
            if result is not None:
                return result

    def _step(self, buf: str, final: bool) -> _Outcome:
        state = self._state
        if state is _State.OPEN:
            return self._expect_then(buf, final, (FUNCTION_OPEN,), self._on_function_open)
        if state is _State.FUNCTION_NAME:
            return self._read_function_name(buf, final)
        if state is _State.FUNCTION_BODY:
            return self._expect_then(
                buf, final, (PARAMETER_OPEN, FUNCTION_CLOSE), self._on_function_body_token
            )
        if state is _State.PARAMETER_NAME:
            return self._read_parameter_name(buf, final)
        if state is _State.PARAMETER_VALUE:
            return self._read_parameter_value(buf, final)
        if state is _State.AFTER_FUNCTION:
            return self._expect_then(buf, final, (TOOL_CALL_CLOSE,), self._on_call_close)
        return self._after_call(buf, final)

    # -- structural tokens -------------------------------------------------------------------

    def _match(self, buf: str, final: bool, tokens: Sequence[str]) -> str | _Signal:
        """Skip whitespace, then return the token at the cursor, NEED or MISMATCH."""
        pos = _STRUCT_SPACE.match(buf, self._pos).end()
        self._pos = pos
        for token in tokens:
            if buf.startswith(token, pos):
                return token
        if not final and _is_proper_prefix(buf, pos, tokens):
            return _Signal.NEED
        return _Signal.MISMATCH

    def _expect_then(
        self, buf: str, final: bool, tokens: Sequence[str], then: Callable[[str], None]
    ) -> _Outcome:
        token = self._match(buf, final, tokens)
        if token is _Signal.NEED:
            return token
        if isinstance(token, _Signal):
            return _Failed(FallbackReason.MALFORMED_STRUCTURE, self._pos)
        self._pos += len(token)
        then(token)
        return None

    def _on_function_open(self, _token: str) -> None:
        self._mark = self._pos
        self._state = _State.FUNCTION_NAME

    def _on_function_body_token(self, token: str) -> None:
        if token == PARAMETER_OPEN:
            self._mark = self._pos
            self._state = _State.PARAMETER_NAME
        else:
            self._state = _State.AFTER_FUNCTION

    def _on_call_close(self, _token: str) -> None:
        self.calls.append((self._name, self._params))
        self._state = _State.AFTER_CALL

    def _after_call(self, buf: str, final: bool) -> _Outcome:
        pos = _STRUCT_SPACE.match(buf, self._pos).end()
        if pos == len(buf):
            self._pos = pos
            return _Signal.ACCEPTED if final else _Signal.NEED
        tokens = (TOOL_CALL_OPEN, THINK_CLOSE) if self.reasoning_open else (TOOL_CALL_OPEN,)
        token = self._match(buf, final, tokens)
        if token is _Signal.NEED:
            return token
        if isinstance(token, _Signal):
            # Qwen renders content before calls, so text after them cannot be replayed in order.
            return _Failed(FallbackReason.TRAILING_CONTENT, self._pos)
        self._pos += len(token)
        if token == THINK_CLOSE:
            self.reasoning_open = False
        else:
            self._state = _State.OPEN
        return None

    # -- names and values --------------------------------------------------------------------

    def _read_name(self, buf: str, final: bool, bad: FallbackReason) -> str | _Outcome:
        """The name at a complete `NAME>`, else NEED or the failure (`bad` for a bad name)."""
        start = self._mark
        end = _NAME_RUN.match(buf, start).end()
        if end - start > MAX_NAME_CHARS:
            return _Failed(bad, start)
        if end == len(buf):
            return _Failed(FallbackReason.MALFORMED_STRUCTURE, end) if final else _Signal.NEED
        if buf[end] != ">" or end == start:
            return _Failed(bad, end)
        self._pos = end + 1
        return buf[start:end]

    def _read_function_name(self, buf: str, final: bool) -> _Outcome:
        name = self._read_name(buf, final, FallbackReason.INVALID_TOOL_NAME)
        if not isinstance(name, str):
            return name
        if name not in self._catalog:
            return _Failed(FallbackReason.UNDECLARED_TOOL, self._pos)
        self._name = name
        self._params = {}
        self._state = _State.FUNCTION_BODY
        return None

    def _read_parameter_name(self, buf: str, final: bool) -> _Outcome:
        name = self._read_name(buf, final, FallbackReason.MALFORMED_STRUCTURE)
        if not isinstance(name, str):
            return name
        if name in self._params:
            return _Failed(FallbackReason.DUPLICATE_PARAMETER, self._pos)
        self._param = name
        self._mark = self._scan = self._pos
        self._depth = 0
        self._state = _State.PARAMETER_VALUE
        return None

    def _read_parameter_value(self, buf: str, final: bool) -> _Outcome:
        while True:
            at = buf.find("<", self._scan)
            if at < 0:
                self._scan = len(buf)
                break
            if buf.startswith(PARAMETER_CLOSE, at):
                if self._depth == 0:
                    self._params[self._param] = _strip_format_newlines(buf[self._mark : at])
                    self._pos = at + len(PARAMETER_CLOSE)
                    self._state = _State.FUNCTION_BODY
                    return None
                self._depth -= 1
                self._scan = at + len(PARAMETER_CLOSE)
            elif buf.startswith(PARAMETER_OPEN, at):
                self._depth += 1
                self._scan = at + len(PARAMETER_OPEN)
            elif _is_proper_prefix(buf, at, (PARAMETER_OPEN, PARAMETER_CLOSE)):
                self._scan = at
                break
            else:
                self._scan = at + 1
        if final:  # unterminated or unbalanced value
            return _Failed(FallbackReason.MALFORMED_STRUCTURE, len(buf))
        return _Signal.NEED


def _is_proper_prefix(buf: str, at: int, tokens: Sequence[str]) -> bool:
    """Whether buf[at:] is a proper prefix of one of the tokens (so it may still become one)."""
    rest = len(buf) - at
    return any(rest < len(t) and t.startswith(buf[at:]) for t in tokens)


def _strip_format_newlines(raw: str) -> str:
    # The template writes `<parameter=NAME>\nVALUE\n</parameter>`: remove exactly that framing.
    if raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\n"):
        raw = raw[:-1]
    return raw


class _Channel:
    """Per-channel newline framing: the newlines the chat format puts around markers are dropped.

    Leading newlines of a segment (after `<think>` / `</think>`) are dropped; a trailing newline run
    is held while a marker may still follow and is released as soon as more text of the channel
    arrives, so only newlines directly before a marker (or a successful tool region) disappear.
    """

    def __init__(self, kind: DeltaKind) -> None:
        self.kind = kind
        self.at_segment_start = True
        self.num_held_newlines = 0

    def take(self, text: str, hold_trailing: bool) -> str:
        if self.at_segment_start:
            text = text.lstrip("\n")
            if not text:
                return ""
            self.at_segment_start = False
        body = text.rstrip("\n") if hold_trailing else text
        if not body:
            self.num_held_newlines += len(text)
            return ""
        released = "\n" * self.num_held_newlines + body
        self.num_held_newlines = len(text) - len(body)
        return released

    def end_segment(self) -> None:
        self.num_held_newlines = 0


class OutputDecoder:
    """Streaming splitter of one request's output into reasoning, content and tool calls.

    `tools` are the request's effective function tools (see ToolCatalog.from_tools); None or empty
    turns tool parsing off, so tool markup is plain text. `starts_in_reasoning` is True when the
    prompt pre-opened `<think>` (thinking enabled); a `<think>` at the very start of the output also
    opens reasoning. Reasoning ends at `</think>`; reasoning that never closes stays reasoning.

    Tool calls: from a complete `<tool_call>` marker (in either channel) the output is held as a
    tool region. A region that is disproven (malformed, undeclared or invalid name, duplicate
    parameter, non-whitespace text after its calls) is released verbatim as text in order and
    scanning resumes after the failing point; a region still well formed when the output ends
    becomes structured calls, also when it lies before `</think>`. Calls are therefore emitted by
    finish(): the region must end the output, because Qwen cannot replay content after calls.

    `single_call` (parallel_tool_calls: false) ends the turn after its first call: generation
    must stop at the first `</tool_call>`, so `stop_strings` names it for the engine's stop
    matcher, and finish(stop=...) restores the marker the matcher withheld.
    """

    def __init__(
        self,
        *,
        tools: Sequence[Mapping[str, Any]] | None,
        starts_in_reasoning: bool,
        single_call: bool = False,
    ) -> None:
        self._catalog = ToolCatalog.from_tools(tools) if tools else None
        self.stop_strings: tuple[str, ...] = (
            (TOOL_CALL_CLOSE,) if single_call and self._catalog is not None else ()
        )
        self._channels = {kind: _Channel(kind) for kind in (DeltaKind.REASONING, DeltaKind.CONTENT)}
        self._channel = self._channels[
            DeltaKind.REASONING if starts_in_reasoning else DeltaKind.CONTENT
        ]
        self._buf = ""  # unresolved text: a held marker prefix, or the open tool region
        self._plain_until = 0  # a <tool_call> starting before this offset is text (fallback)
        self._at_output_start = True
        self._region: _ToolRegion | None = None
        self._num_calls = 0
        self._finished = False
        self._out: list[OutputDelta] = []
        self._parts: list[str] = []  # text of the delta being built, all of kind _parts_kind
        self._parts_kind: DeltaKind | None = None
        self.stats = ToolCallParseStats()

    @property
    def in_reasoning(self) -> bool:
        """True until `</think>` has been fed in full; the engine counts reasoning tokens by it."""
        if self._region is not None:
            return self._region.reasoning_open
        return self._channel.kind is DeltaKind.REASONING

    def feed(self, text: str) -> list[OutputDelta]:
        """Consume committed text; return the deltas it makes unambiguous (adjacent text merged)."""
        if self._finished:
            raise OutputDecoderError("feed() after finish()")
        self._buf += text
        self._run(final=False)
        return self._take()

    def finish(self, stop: str | None = None) -> list[OutputDelta]:
        """End of output: settle the held text and the open tool region (calls come out here).

        `stop` is the stop string that ended the output; one of this decoder's own
        `stop_strings` is part of the model's markup and is fed back before settling.
        """
        if self._finished:
            raise OutputDecoderError("finish() called twice")
        if stop is not None and stop in self.stop_strings:
            self._buf += stop
        self._finished = True
        self._run(final=True)
        for channel in self._channels.values():
            if channel.num_held_newlines:
                self._push(channel.kind, "\n" * channel.num_held_newlines)
                channel.end_segment()
        return self._take()

    # -- driver ------------------------------------------------------------------------------

    def _run(self, final: bool) -> None:
        while True:
            if self._region is not None:
                outcome = self._region.advance(self._buf, final)
                if outcome is _Signal.NEED:
                    return
                if outcome is _Signal.ACCEPTED:
                    self._accept_region()
                    return
                assert isinstance(outcome, _Failed)
                self._reject_region(outcome)
            if not self._scan_text(final):
                return

    def _active_markers(self, at: int) -> list[str]:
        markers = []
        if self._at_output_start and at == 0:
            markers.append(THINK_OPEN)
        if self._channel.kind is DeltaKind.REASONING:
            markers.append(THINK_CLOSE)
        if self._catalog is not None and at >= self._plain_until:
            markers.append(TOOL_CALL_OPEN)
        return markers

    def _scan_text(self, final: bool) -> bool:
        """Release text up to a held marker prefix; return True when a tool region opened."""
        buf = self._buf
        done = 0
        while True:
            at = buf.find("<", done)
            if at < 0:
                self._emit(buf[done:])
                done = len(buf)
                break
            self._emit(buf[done:at])
            markers = self._active_markers(at)
            marker = next((m for m in markers if buf.startswith(m, at)), None)
            if marker is None:
                if not final and _is_proper_prefix(buf, at, markers):
                    done = at
                    break
                self._emit("<")
                done = at + 1
            elif marker == TOOL_CALL_OPEN and self._catalog is not None:
                self._consume(at)
                self._at_output_start = False
                self.stats.marker_seen = True
                reasoning_open = self._channel.kind is DeltaKind.REASONING
                self._region = _ToolRegion(self._catalog, reasoning_open=reasoning_open)
                return True
            else:
                done = at + len(marker)
                self._switch_channel(marker)
        self._consume(done)
        return False

    def _consume(self, num_chars: int) -> None:
        if num_chars:
            self._buf = self._buf[num_chars:]
            self._plain_until = max(0, self._plain_until - num_chars)
            self._at_output_start = False

    def _switch_channel(self, marker: str) -> None:
        self._channel.end_segment()
        kind = DeltaKind.REASONING if marker == THINK_OPEN else DeltaKind.CONTENT
        self._channel = self._channels[kind]
        self._channel.at_segment_start = True
        self._channel.end_segment()

    def _accept_region(self) -> None:
        region, catalog = self._region, self._catalog
        assert region is not None and catalog is not None
        self._channel.end_segment()  # newlines framing the region are not text
        for name, raw_params in region.calls:
            arguments: dict[str, Any] = {}
            for param, raw in raw_params.items():
                typed = coerce_parameter(raw, catalog.param_types(name, param))
                if typed.omitted:
                    self.stats.num_empty_omitted += 1
                    continue
                self.stats.num_mismatched_preserved += typed.mismatched
                arguments[param] = typed.value
            text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
            call = ToolCall(index=self._num_calls, name=name, arguments=text)
            self._push_call(call)
            self._num_calls += 1
        self.stats.num_calls = self._num_calls
        if not region.reasoning_open:
            self._channel = self._channels[DeltaKind.CONTENT]
        self._buf = ""
        self._region = None

    def _reject_region(self, failed: _Failed) -> None:
        # Rescan the region's text as plain text: `</think>` inside it still closes reasoning, while
        # tool markers before the cut stay text, so the whole failed region falls back in order.
        if self.stats.fallback_reason is FallbackReason.NONE:
            self.stats.fallback_reason = failed.reason
        self._plain_until = failed.cut
        self._region = None

    # -- output ------------------------------------------------------------------------------

    def _emit(self, text: str) -> None:
        if not text:
            return
        channel = self._channel
        # Hold trailing newlines only where a marker can still end the segment.
        hold = channel.kind is DeltaKind.REASONING or self._catalog is not None
        released = channel.take(text, hold)
        if released:
            self._push(channel.kind, released)

    def _push(self, kind: DeltaKind, text: str) -> None:
        if kind is not self._parts_kind:
            self._flush_parts()
            self._parts_kind = kind
        self._parts.append(text)

    def _push_call(self, call: ToolCall) -> None:
        self._flush_parts()
        self._out.append(OutputDelta(DeltaKind.TOOL_CALL, tool_call=call))

    def _flush_parts(self) -> None:
        if self._parts:
            assert self._parts_kind is not None
            self._out.append(OutputDelta(self._parts_kind, "".join(self._parts)))
            self._parts = []

    def _take(self) -> list[OutputDelta]:
        self._flush_parts()
        out, self._out = self._out, []
        return out
