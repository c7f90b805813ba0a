"""Chat stream assembly from engine ChatEvents: chunk order, tool calls, usage and timings."""

from __future__ import annotations

from typing import Any

from ninfer.api import ChatEvent, ChatUsage
from ninfer.chat.output_decoder import ToolCall
from ninfer.engine.request import FinishReason, Timings
from ninfer.protocol.openai_chat import parse_chat_request
from ninfer.server.openai_routes import _ChatRun

TIMINGS = Timings(cache_n=0, prompt_n=5, prompt_ms=10.0, predicted_n=3, predicted_ms=20.0)


def run_for(**fields: Any) -> _ChatRun:
    chat = parse_chat_request({"model": "m", "messages": [{"role": "user", "content": "x"}],
                               **fields})  # fmt: skip
    return _ChatRun("req-abc", chat, "m")


def events(finish: FinishReason = FinishReason.STOP, tool: bool = False) -> list[ChatEvent]:
    out = [
        ChatEvent("admitted", num_prompt=5),
        ChatEvent("progress", num_processed=3, num_prompt=5),
        ChatEvent("progress", num_processed=5, num_prompt=5),
        ChatEvent("reasoning", text="hm", token_ids=[1], num_output=1),
        ChatEvent("content", text="ok", token_ids=[2], num_output=3),  # a commit held no text
    ]
    if tool:
        out.append(ChatEvent("tool_call", tool_call=ToolCall(0, "f", '{"a": 1}')))
    usage = ChatUsage(5, 3, cached_tokens=0, reasoning_tokens=1)
    out.append(ChatEvent("finished", finish_reason=finish, usage=usage, timings=TIMINGS))
    return out


def frames(run: _ChatRun, evs: list[ChatEvent]) -> list[dict[str, Any]]:
    return [frame for ev in evs for frame in run.frames(ev)]


def test_plain_stream_puts_timings_on_the_finish_chunk() -> None:
    out = frames(run_for(stream=True), events())
    assert [f["choices"][0]["delta"] for f in out[:-1]] == [
        {"reasoning_content": "hm"},
        {"content": "ok"},
    ]
    last = out[-1]
    assert last["choices"][0]["finish_reason"] == "stop"
    assert last["timings"] == TIMINGS.to_dict()
    assert all("timings" not in f and "usage" not in f for f in out[:-1])
    assert all(f["id"] == "chatcmpl-abc" for f in out)


def test_usage_chunk_is_last_and_carries_timings() -> None:
    out = frames(run_for(stream=True, stream_options={"include_usage": True}), events())
    finish, usage = out[-2], out[-1]
    assert finish["choices"][0]["finish_reason"] == "stop" and "timings" not in finish
    assert usage["choices"] == [] and usage["timings"] == TIMINGS.to_dict()
    assert usage["usage"]["completion_tokens_details"] == {"reasoning_tokens": 1}
    assert all(f["usage"] is None for f in out[:-1])


def test_tool_calls_stream_and_finish_as_tool_calls() -> None:
    run = run_for(stream=True)
    out = frames(run, events(tool=True))
    call = out[-2]["choices"][0]["delta"]["tool_calls"][0]
    assert call["index"] == 0 and call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "f", "arguments": '{"a": 1}'}
    assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert run.tool_calls[0]["id"] == call["id"]  # the aggregate view uses the same id


def test_context_finish_reads_as_length() -> None:
    out = frames(run_for(stream=True), events(FinishReason.CONTEXT))
    assert out[-1]["choices"][0]["finish_reason"] == "length"


def test_progress_chunks_start_at_cache_and_end_at_total() -> None:
    out = frames(run_for(stream=True, return_progress=True), events())
    progress = [f["prompt_progress"] for f in out if "prompt_progress" in f]
    assert [(p["processed"], p["total"], p["cache"]) for p in progress] == [
        (0, 5, 0),
        (3, 5, 0),
        (5, 5, 0),
    ]
    first_delta = next(i for i, f in enumerate(out) if f["choices"][0]["delta"])
    assert all("prompt_progress" not in f for f in out[first_delta:])


def test_per_token_timings_follow_the_committed_frontier() -> None:
    run = run_for(stream=True, timings_per_token=True)
    evs = [
        ChatEvent("progress", num_processed=5, num_prompt=5),
        ChatEvent("reasoning", text="a", token_ids=[8], num_output=2),  # token 1 held its text
        ChatEvent("content", text="b", token_ids=[8], num_output=2),  # same commit, two deltas
        ChatEvent("content", text="c", token_ids=[9], num_output=3),
    ]
    out = frames(run, evs)
    assert [f["timings"]["predicted_n"] for f in out] == [2, 2, 3]
    assert all(f["timings"]["prompt_n"] == 5 for f in out)


def test_per_token_timings_are_the_engines_snapshot() -> None:
    # The engine's snapshot (its admission and commit instants) is copied, not re-timed on the
    # stream's own clock, so prompt_ms agrees with the terminal timings to the last digit.
    run = run_for(stream=True, timings_per_token=True)
    snap = Timings(cache_n=2, prompt_n=3, prompt_ms=7.25, predicted_n=2, predicted_ms=1.5)
    evs = [
        ChatEvent("admitted", num_prompt=5, num_cached=2),
        ChatEvent("content", text="a", token_ids=[8], num_output=2, timings=snap),
    ]
    out = frames(run, evs)
    assert out[-1]["timings"] == snap.to_dict()
