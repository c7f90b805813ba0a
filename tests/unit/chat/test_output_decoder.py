"""OutputDecoder: golden streams, every-boundary splits, and a generated-stream oracle.

The oracle test builds outputs from known parts (reasoning, content, rendered calls, one chosen
corruption) so the expected split is known independently of the decoder's algorithm.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ninfer.chat.output_decoder import (
    DeltaKind,
    FallbackReason,
    OutputDecoder,
    OutputDecoderError,
    ToolCall,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "metric": {"type": "boolean"},
                    "note": {"description": "no type: untyped inference"},
                },
            },
        },
    },
    {"type": "function", "name": "search", "parameters": {"properties": {"q": {"type": "string"}}}},
]


@dataclass
class Decoded:
    reasoning: str
    content: str
    calls: list[ToolCall]
    deltas: list
    decoder: OutputDecoder


def decode(chunks, *, tools=TOOLS, starts_in_reasoning=False) -> Decoded:
    if isinstance(chunks, str):
        chunks = [chunks]
    decoder = OutputDecoder(tools=tools, starts_in_reasoning=starts_in_reasoning)
    deltas = []
    for chunk in chunks:
        deltas += decoder.feed(chunk)
    deltas += decoder.finish()
    return Decoded(
        reasoning="".join(d.text for d in deltas if d.kind is DeltaKind.REASONING),
        content="".join(d.text for d in deltas if d.kind is DeltaKind.CONTENT),
        calls=[d.tool_call for d in deltas if d.kind is DeltaKind.TOOL_CALL],
        deltas=deltas,
        decoder=decoder,
    )


def call_xml(name: str, *params: tuple[str, str]) -> str:
    """The Qwen3.5 template's rendering of one call (independent of the decoder's grammar)."""
    body = "".join(f"<parameter={p}>\n{v}\n</parameter>\n" for p, v in params)
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def args(call: ToolCall) -> list:
    """Arguments as [name, value] pairs, so member order is part of every comparison."""
    return json.loads(call.arguments, object_pairs_hook=lambda pairs: [list(p) for p in pairs])


def summary(result: Decoded):
    stats = result.decoder.stats
    return (result.reasoning, result.content, result.calls, stats)


# -- golden streams --------------------------------------------------------------------------

WEATHER = call_xml("get_weather", ("city", "Paris"), ("days", "3"))

GOLDEN = {
    "reasoning_then_content": (
        "The user says hi.\nI should greet.\n</think>\n\nHello! How can I help?",
        True,
    ),
    "think_opened_by_output": ("<think>\nShort thought.\n</think>\n\nAnswer.", False),
    "reasoning_never_closes": ("Thinking and thinking\nand more", True),
    "content_only": ("Plain answer with a < sign and a </think> spelling.\n", False),
    "single_call": ("I'll check the weather.\n\n" + WEATHER, False),
    "parallel_calls": (WEATHER + "\n" + call_xml("search", ("q", "rain gear")), False),
    "call_in_reasoning": ("Need weather.\n" + WEATHER, True),
    "call_then_close_think": ("Need weather.\n" + WEATHER + "\n</think>\n\n", True),
    "nested_parameter_text": (
        call_xml(
            "search",
            ("q", "a <parameter=x>\ninner\n</parameter> b </function></tool_call> <tool_call>"),
        ),
        False,
    ),
    "prose_mention": ("Emit <tool_call> tags, or `<tool_call>\n<function=`.", False),
    "undeclared": ("Sure.\n\n" + call_xml("launch_rockets", ("count", "3")), False),
    "malformed_missing_close": (
        "<tool_call>\n<function=search>\n<parameter=q>\nx\n</function>\n</tool_call>",
        False,
    ),
    "trailing_content": (WEATHER + "\nDone, anything else?", False),
    "duplicate_parameter": (call_xml("search", ("q", "a"), ("q", "b")), False),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_golden_stream_is_split_invariant(name):
    text, thinking = GOLDEN[name]
    whole = summary(decode(text, starts_in_reasoning=thinking))
    assert summary(decode(list(text), starts_in_reasoning=thinking)) == whole
    for cut in range(1, len(text)):
        pieces = [text[:cut], text[cut:]]
        assert summary(decode(pieces, starts_in_reasoning=thinking)) == whole, cut


def test_reasoning_then_content():
    out = decode(GOLDEN["reasoning_then_content"][0], starts_in_reasoning=True)
    assert out.reasoning == "The user says hi.\nI should greet."
    assert out.content == "Hello! How can I help?"
    assert out.calls == []


def test_output_that_opens_think_itself_is_split():
    out = decode(GOLDEN["think_opened_by_output"][0], starts_in_reasoning=False)
    assert (out.reasoning, out.content) == ("Short thought.", "Answer.")


def test_reasoning_that_never_closes_stays_reasoning():
    out = decode(GOLDEN["reasoning_never_closes"][0], starts_in_reasoning=True)
    assert (out.reasoning, out.content) == ("Thinking and thinking\nand more", "")
    assert out.decoder.in_reasoning


def test_content_keeps_marker_spellings_and_trailing_newline():
    text = GOLDEN["content_only"][0]
    out = decode(text, starts_in_reasoning=False)
    assert (out.reasoning, out.content) == ("", text)


def test_single_call_typed_by_schema():
    out = decode(GOLDEN["single_call"][0])
    assert out.content == "I'll check the weather."
    assert [(c.index, c.name) for c in out.calls] == [(0, "get_weather")]
    assert args(out.calls[0]) == [["city", "Paris"], ["days", 3]]
    stats = out.decoder.stats
    assert (stats.marker_seen, stats.num_calls, stats.fallback_reason) == (
        True,
        1,
        FallbackReason.NONE,
    )


def test_parallel_calls_keep_order_and_indices():
    out = decode(GOLDEN["parallel_calls"][0])
    assert [(c.index, c.name) for c in out.calls] == [(0, "get_weather"), (1, "search")]
    assert args(out.calls[1]) == [["q", "rain gear"]]
    assert out.content == ""


def test_complete_call_before_close_think_is_structured():
    for key in ("call_in_reasoning", "call_then_close_think"):
        out = decode(GOLDEN[key][0], starts_in_reasoning=True)
        assert out.reasoning == "Need weather."
        assert out.content == ""
        assert [c.name for c in out.calls] == ["get_weather"], key
    assert decode(GOLDEN["call_in_reasoning"][0], starts_in_reasoning=True).decoder.in_reasoning
    closed = decode(GOLDEN["call_then_close_think"][0], starts_in_reasoning=True)
    assert not closed.decoder.in_reasoning


def test_nested_parameter_text_is_value_bytes():
    out = decode(GOLDEN["nested_parameter_text"][0])
    value = "a <parameter=x>\ninner\n</parameter> b </function></tool_call> <tool_call>"
    assert args(out.calls[0]) == [["q", value]]


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("undeclared", FallbackReason.UNDECLARED_TOOL),
        ("malformed_missing_close", FallbackReason.MALFORMED_STRUCTURE),
        ("trailing_content", FallbackReason.TRAILING_CONTENT),
        ("duplicate_parameter", FallbackReason.DUPLICATE_PARAMETER),
        ("prose_mention", FallbackReason.MALFORMED_STRUCTURE),
    ],
)
def test_fallback_returns_every_byte_as_text(key, reason):
    text = GOLDEN[key][0]
    out = decode(text)
    assert out.calls == []
    assert out.content == text
    assert out.decoder.stats.fallback_reason is reason
    assert out.decoder.stats.marker_seen


@pytest.mark.parametrize(
    ("region", "reason"),
    [
        (call_xml("get weather", ("city", "x")), FallbackReason.INVALID_TOOL_NAME),
        (call_xml("", ("city", "x")), FallbackReason.INVALID_TOOL_NAME),
        ("<tool_call>\n<function=search>\n</parameter>\n</function>\n</tool_call>", None),
        (call_xml("search", ("q", "open <parameter=z> never closed")), None),
        (call_xml("search", ("q", "x")).replace("</tool_call>", "</tool_call"), None),
        ("<tool_call>\n<function=search>\nstray\n</function>\n</tool_call>", None),
        ("<tool_call>\n<function=search>\n<parameter=bad name>\nx\n</parameter>", None),
    ],
    ids=["space", "empty", "stray_close", "unbalanced", "truncated", "junk", "param_name"],
)
def test_broken_markup_falls_back(region, reason):
    text = "Before. " + region
    out = decode(text)
    assert out.calls == []
    assert out.content == text
    assert out.decoder.stats.fallback_reason is (reason or FallbackReason.MALFORMED_STRUCTURE)


def test_answer_text_streams_at_once_and_only_marker_prefix_is_held():
    decoder = OutputDecoder(tools=TOOLS, starts_in_reasoning=False)
    assert [d.text for d in decoder.feed("Hello wor")] == ["Hello wor"]
    assert [d.text for d in decoder.feed("ld <tool")] == ["ld "]
    assert [d.text for d in decoder.feed("s>")] == ["<tools>"]


def test_prose_mention_is_released_once_unambiguous():
    decoder = OutputDecoder(tools=TOOLS, starts_in_reasoning=False)
    assert [d.text for d in decoder.feed("Use <tool_call>")] == ["Use "]
    assert decoder.feed(" ") == []  # whitespace may still precede <function=
    assert [d.text for d in decoder.feed("tags")] == ["<tool_call> tags"]


def test_undeclared_tool_is_released_at_its_name():
    decoder = OutputDecoder(tools=TOOLS, starts_in_reasoning=False)
    assert decoder.feed("<tool_call>\n<function=nope") == []
    assert [d.text for d in decoder.feed(">")] == ["<tool_call>\n<function=nope>"]


def test_close_think_inside_a_value_is_value_bytes():
    text = "Plan.\n" + call_xml("search", ("q", "a </think> b"))
    out = decode(text, starts_in_reasoning=True)
    assert out.reasoning == "Plan."
    assert args(out.calls[0]) == [["q", "a </think> b"]]
    assert out.decoder.in_reasoning


def test_open_think_repeated_by_the_output_is_consumed():
    out = decode("<think>\nx\n</think>\n\ny", starts_in_reasoning=True)
    assert (out.reasoning, out.content) == ("x", "y")
    later = decode("a<think>b", starts_in_reasoning=False)
    assert (later.reasoning, later.content) == ("", "a<think>b")


def test_reasoning_flag_flips_when_close_think_is_complete():
    decoder = OutputDecoder(tools=None, starts_in_reasoning=True)
    flags = []
    for piece in ["a", "</", "think", ">", "b"]:
        decoder.feed(piece)
        flags.append(decoder.in_reasoning)
    assert flags == [True, True, True, False, False]


def test_tools_off_treats_markup_as_text():
    out = decode("x\n\n" + WEATHER, tools=None)
    assert out.calls == []
    assert out.content == "x\n\n" + WEATHER
    assert not out.decoder.stats.marker_seen


def test_call_after_fallback_still_parses_and_first_reason_is_kept():
    text = "Use <tool_call> here.\n\n" + call_xml("nope") + "\n" + call_xml("search", ("q", "z"))
    out = decode(text)
    assert [c.name for c in out.calls] == ["search"]
    assert out.content == "Use <tool_call> here.\n\n" + call_xml("nope")
    assert out.decoder.stats.fallback_reason is FallbackReason.MALFORMED_STRUCTURE
    assert out.decoder.stats.num_calls == 1


def test_fallback_region_in_reasoning_still_closes_at_think():
    text = "Plan: " + call_xml("nope") + "\n</think>\n\nAnswer"
    out = decode(text, starts_in_reasoning=True)
    assert (out.reasoning, out.content) == ("Plan: " + call_xml("nope"), "Answer")
    assert out.decoder.stats.fallback_reason is FallbackReason.UNDECLARED_TOOL


def test_content_after_call_in_reasoning_is_trailing_content():
    text = "Plan " + WEATHER + "\n</think>\n\nThe weather is fine."
    out = decode(text, starts_in_reasoning=True)
    assert out.calls == []
    assert (out.reasoning, out.content) == ("Plan " + WEATHER, "The weather is fine.")
    assert out.decoder.stats.fallback_reason is FallbackReason.TRAILING_CONTENT


@pytest.mark.parametrize(
    ("param", "raw", "expected", "omitted", "mismatched"),
    [
        ("city", "", [["city", ""]], 0, 0),
        ("city", "123", [["city", "123"]], 0, 0),
        ("days", "", [], 1, 0),
        ("days", "  ", [], 1, 0),
        ("days", "7", [["days", 7]], 0, 0),
        ("days", "seven", [["days", "seven"]], 0, 1),
        ("days", "[1]", [["days", [1]]], 0, 1),
        ("days", "1e400", [["days", "1e400"]], 0, 1),
        ("metric", "TRUE", [["metric", True]], 0, 0),
        ("metric", "False", [["metric", False]], 0, 0),
        ("note", "42", [["note", 42]], 0, 0),
        ("note", "True", [["note", True]], 0, 0),
        ("note", "hello", [["note", "hello"]], 0, 0),
        ("undeclared_param", '{"a": 1}', [["undeclared_param", [["a", 1]]]], 0, 0),
    ],
)
def test_parameter_typing_in_calls(param, raw, expected, omitted, mismatched):
    out = decode(call_xml("get_weather", (param, raw)))
    assert args(out.calls[0]) == expected
    stats = out.decoder.stats
    assert (stats.num_empty_omitted, stats.num_mismatched_preserved) == (omitted, mismatched)


def test_feed_after_finish_raises():
    decoder = OutputDecoder(tools=None, starts_in_reasoning=False)
    decoder.finish()
    with pytest.raises(OutputDecoderError):
        decoder.feed("x")


# -- generated streams against an oracle -----------------------------------------------------

SAFE = st.text(alphabet="ab <>=/\n", max_size=12).map(lambda s: s.strip("\n"))
NESTED_PIECES = [
    "<parameter=q>in</parameter>",
    "</function>",
    "</tool_call>",
    "<tool_call> z",
    "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>",
    "<function=get_weather>",
]
UNTYPED = {"hello": "hello", "42": 42, "true": True, "[1, 2]": [1, 2]}
CORRUPTIONS = [
    None,
    "trailing",
    "truncate",
    "undeclared",
    "invalid_name",
    "duplicate",
    "stray_close",
    "unbalanced",
]
REASONS = {
    "trailing": FallbackReason.TRAILING_CONTENT,
    "truncate": FallbackReason.MALFORMED_STRUCTURE,
    "undeclared": FallbackReason.UNDECLARED_TOOL,
    "invalid_name": FallbackReason.INVALID_TOOL_NAME,
    "duplicate": FallbackReason.DUPLICATE_PARAMETER,
    "stray_close": FallbackReason.MALFORMED_STRUCTURE,
    "unbalanced": FallbackReason.MALFORMED_STRUCTURE,
}


@st.composite
def generated_call(draw):
    """(xml params, expected argument pairs, number of omitted empty params)."""
    params, expected, omitted = [], [], 0
    if draw(st.booleans()):
        city = draw(st.lists(st.one_of(SAFE, st.sampled_from(NESTED_PIECES)), max_size=3))
        params.append(("city", "".join(city)))
        expected.append(["city", "".join(city)])
    if draw(st.booleans()):
        days = draw(st.one_of(st.just(""), st.integers(-5, 10**12).map(str)))
        params.append(("days", days))
        if days:
            expected.append(["days", int(days)])
        else:
            omitted += 1
    if draw(st.booleans()):
        note = draw(st.sampled_from(sorted(UNTYPED)))
        params.append(("note", note))
        expected.append(["note", UNTYPED[note]])
    return params, expected, omitted


def render_call(name, params, corruption):
    if corruption == "duplicate":
        params = params + params[:1]
    xml = call_xml(name, *params)
    if corruption == "stray_close":
        head = f"<function={name}>\n"
        xml = xml.replace(head, head + "</parameter>\n", 1)
    if corruption == "unbalanced":
        xml = xml.replace(f"<parameter={params[0][0]}>\n", f"<parameter={params[0][0]}>\n<z=", 1)
        xml = xml.replace("<z=", "<parameter=z>", 1)
    return xml


def plain_split(text, thinking):
    """Expected channels when all markup is text: only <think>/</think> and newline framing."""
    if not thinking:
        return "", text.lstrip("\n")
    if "</think>" in text:
        reasoning, content = text.split("</think>", 1)
        return reasoning.strip("\n"), content.lstrip("\n")
    return text.lstrip("\n"), ""


@st.composite
def scenario(draw):
    """A generated output and its expected decoding, derived from how it was assembled."""
    thinking = draw(st.booleans())
    closes = thinking and draw(st.booleans())
    reasoning = draw(SAFE) if thinking else ""
    content = draw(SAFE) if (closes or not thinking) else ""
    places = ["none"]
    places += ["reasoning"] if thinking else []
    places += ["content"] if (closes or not thinking) else []
    place = draw(st.sampled_from(places))
    calls = draw(st.lists(generated_call(), min_size=1, max_size=3))
    corruption = draw(st.sampled_from(CORRUPTIONS)) if place != "none" else None
    region_ends_output = place == "content" or (place == "reasoning" and not closes)
    bad = draw(st.integers(0, len(calls) - 1))
    if corruption == "truncate":
        bad = len(calls) - 1
    if (corruption == "truncate" and not region_ends_output) or (
        corruption in ("duplicate", "unbalanced") and not calls[bad][0]
    ):
        corruption = None

    blocks = []
    for i, (params, _, _) in enumerate(calls):
        kind = corruption if i == bad else None
        name = {"undeclared": "nope", "invalid_name": "get weather"}.get(kind, "get_weather")
        blocks.append(render_call(name, params, kind))
    if corruption == "truncate":
        blocks[-1] = blocks[-1][: -draw(st.integers(1, len("</tool_call>")))]
    region = "\n".join(blocks)
    if corruption == "trailing":
        region += "\n" + "zz" + draw(SAFE)

    text, region_at = reasoning, -1
    if place == "reasoning":
        text += "\n"
        region_at = len(text)
        text += region
    if closes:
        text += "\n</think>\n\n" + content
    elif not thinking:
        text = content
    if place == "content":
        text += "\n\n"
        region_at = len(text)
        text += region

    # Which calls survive: a broken block falls back alone (later blocks may still be calls),
    # except where the damage is only known at the end (unbalanced, truncated) or calls are
    # followed by content (trailing), which returns the whole run to text.
    content_after_reasoning_calls = place == "reasoning" and closes and content.strip() != ""
    reason = FallbackReason.NONE
    if corruption is not None:
        reason = REASONS[corruption]
    elif content_after_reasoning_calls:
        reason = FallbackReason.TRAILING_CONTENT
    if place == "none" or content_after_reasoning_calls:
        good = []
    elif corruption in ("undeclared", "invalid_name", "duplicate", "stray_close"):
        good = list(range(bad + 1, len(calls)))
    elif corruption is None:
        good = list(range(len(calls)))
    else:
        good = []
    if good:
        start = region_at + sum(len(blocks[i]) + 1 for i in range(good[0]))
        expected_reasoning, expected_content = plain_split(text[:start], thinking)
        # The newlines framing the surviving region are dropped with it.
        if place == "content":
            expected_content = expected_content.rstrip("\n")
        else:
            expected_reasoning = expected_reasoning.rstrip("\n")
    else:
        expected_reasoning, expected_content = plain_split(text, thinking)
    expected = (
        (expected_reasoning, expected_content),
        [calls[i][1] for i in good],
        sum(calls[i][2] for i in good),
        reason,
    )
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return text, chunks, thinking, place, expected


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_generated_streams_match_oracle(case):
    text, chunks, thinking, place, (expected_text, expected_calls, omitted, reason) = case
    out = decode(chunks, starts_in_reasoning=thinking)
    assert (out.reasoning, out.content) == expected_text
    assert [args(c) for c in out.calls] == expected_calls
    assert [c.index for c in out.calls] == list(range(len(expected_calls)))
    stats = out.decoder.stats
    assert stats.fallback_reason is reason
    assert stats.num_calls == len(expected_calls)
    assert stats.num_empty_omitted == omitted
    assert stats.marker_seen == (place != "none")
    assert summary(decode(text, starts_in_reasoning=thinking)) == summary(out)


SOUP = [
    "<tool_call>",
    "</tool_call>",
    "<function=search>",
    "<function=x y>",
    "<parameter=q>",
    "</parameter>",
    "</function>",
    "<think>",
    "</think>",
    "<",
    "/",
    ">",
    "=",
    "a",
    " ",
    "\n",
]


@st.composite
def soup_and_chunks(draw):
    text = "".join(draw(st.lists(st.sampled_from(SOUP), max_size=30)))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    return text, [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(soup_and_chunks(), st.booleans())
def test_random_markup_soup_is_split_invariant(case, thinking):
    """Arbitrary markup mixes: no crash, and chunking never changes the decoded result."""
    text, chunks = case
    whole = decode(text, starts_in_reasoning=thinking)
    assert summary(decode(chunks, starts_in_reasoning=thinking)) == summary(whole)
    if not whole.calls:  # all tool markup fell back: exactly the input, split at </think>
        opened = text.startswith("<think>")
        plain = text[len("<think>") :] if opened else text
        assert (whole.reasoning, whole.content) == plain_split(plain, thinking or opened)


# -- single-call turns (parallel_tool_calls: false) --------------------------------------------

FIRST_CALL = (
    "<think>\nplan\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n</function>\n"
)


def test_single_call_decoder_asks_the_engine_to_stop_at_the_first_call_close() -> None:
    assert OutputDecoder(tools=TOOLS, starts_in_reasoning=False, single_call=True).stop_strings == (
        "</tool_call>",
    )
    assert OutputDecoder(tools=TOOLS, starts_in_reasoning=False).stop_strings == ()
    # nothing to call: nothing to stop for
    assert OutputDecoder(tools=None, starts_in_reasoning=False, single_call=True).stop_strings == ()


@pytest.mark.parametrize("cut", range(0, len(FIRST_CALL) + 1, 7))
def test_single_call_restores_the_withheld_close_marker(cut: int) -> None:
    # The engine's stop matcher withholds "</tool_call>" and everything after it.
    decoder = OutputDecoder(tools=TOOLS, starts_in_reasoning=False, single_call=True)
    deltas = decoder.feed(FIRST_CALL[:cut]) + decoder.feed(FIRST_CALL[cut:])
    deltas += decoder.finish(stop="</tool_call>")
    calls = [d.tool_call for d in deltas if d.kind is DeltaKind.TOOL_CALL]
    assert calls == [ToolCall(0, "get_weather", '{"city": "Paris"}')]
    assert "".join(d.text for d in deltas if d.kind is DeltaKind.REASONING) == "plan"
    assert not [d for d in deltas if d.kind is DeltaKind.CONTENT]


def test_a_user_stop_string_is_not_restored() -> None:
    decoder = OutputDecoder(tools=TOOLS, starts_in_reasoning=False, single_call=True)
    deltas = decoder.feed("alpha ") + decoder.finish(stop="beta")
    assert [(d.kind, d.text) for d in deltas] == [(DeltaKind.CONTENT, "alpha ")]
    plain = OutputDecoder(tools=TOOLS, starts_in_reasoning=False)  # not single-call: not its stop
    deltas = plain.feed(FIRST_CALL) + plain.finish(stop="</tool_call>")
    assert not [d for d in deltas if d.kind is DeltaKind.TOOL_CALL]
