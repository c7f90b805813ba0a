"""StopMatcher: golden cases and chunking-invariance against a brute-force whole-text reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.engine.stops import StopMatcher, StopResult, StopStringError


def run(stops, chunks):
    """Feed chunks; return (released text, stop or None, index of the chunk that stopped)."""
    matcher = StopMatcher(stops)
    released, stopped_at = [], None
    for i, chunk in enumerate(chunks):
        result = matcher.feed(chunk)
        released.append(result.text)
        if result.stopped and stopped_at is None:
            stopped_at = i
    if stopped_at is None:
        released.append(matcher.flush())
    return "".join(released), matcher.matched, stopped_at


def reference(stops, text):
    """Scan end positions in order; at the first one where some stop ends, the longest wins."""
    for end in range(1, len(text) + 1):
        ending = [s for s in stops if text[:end].endswith(s)]
        if ending:
            stop = max(ending, key=len)
            return text[: end - len(stop)], stop
    return text, None


def test_stop_across_chunks_is_cut_and_rest_dropped():
    assert run(["STOP"], ["Hello ST", "OP and more", "ignored"]) == ("Hello ", "STOP", 1)


def test_text_that_may_start_a_stop_is_withheld_then_released():
    matcher = StopMatcher(["</end>"])
    assert matcher.feed("a </e") == StopResult("a ", None)
    assert matcher.feed("x") == StopResult("</ex", None)
    assert matcher.feed("</en") == StopResult("", None)
    assert matcher.flush() == "</en"
    assert matcher.matched is None


def test_first_completed_stop_wins_over_an_earlier_starting_longer_one():
    assert run(["abcd", "c"], ["abcd"]) == ("ab", "c", 0)
    assert run(["abcd", "c"], ["a", "b", "c", "d"]) == ("ab", "c", 2)


def test_same_end_prefers_the_longer_stop():
    assert run(["bc", "abc"], ["xabc"]) == ("x", "abc", 0)


def test_feed_after_stop_returns_nothing():
    matcher = StopMatcher(["x"])
    assert matcher.feed("axb").stopped
    assert matcher.feed("more") == StopResult("", "x")
    assert matcher.flush() == ""


def test_no_stops_passes_text_through():
    assert run([], ["a", "b"]) == ("ab", None, None)


@pytest.mark.parametrize("bad", ["", None])
def test_empty_or_non_string_stop_is_rejected(bad):
    with pytest.raises(StopStringError):
        StopMatcher(["ok", bad])


@st.composite
def stream(draw):
    stops = draw(st.lists(st.text(alphabet="ab\n", min_size=1, max_size=4), max_size=4))
    text = draw(st.text(alphabet="ab\nc", max_size=30))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return stops, text, chunks


@settings(max_examples=500, deadline=None)
@given(stream())
def test_any_chunking_matches_whole_text_reference(case):
    stops, text, chunks = case
    released, matched, stopped_at = run(stops, chunks)
    assert (released, matched) == reference(stops, text)
    if matched is not None:
        # The chunk that reports the stop is the one that completed it.
        end = len(released) + len(matched)
        assert (
            sum(len(c) for c in chunks[:stopped_at])
            < end
            <= sum(len(c) for c in chunks[: stopped_at + 1])
        )
