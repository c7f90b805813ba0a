"""Responses rendering: output Items and stream events built from model deltas, and the Response."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ninfer.protocol.openai_responses import parse_responses_request
from ninfer.protocol.openai_responses_render import (
    EventSequencer,
    OutputBuilder,
    ResponseStatus,
    ResponseUsage,
    response_object,
    status_for,
)

IDENTITY = {"ns__f": ("ns", "f")}


def identity(name: str) -> tuple[str | None, str]:
    return IDENTITY.get(name, (None, name))


def feed(builder: OutputBuilder, step: tuple[str, str]) -> list[dict[str, Any]]:
    kind, text = step
    if kind == "reasoning":
        return builder.reasoning(text)
    if kind == "content":
        return builder.content(text)
    return builder.tool_call(kind, text)


steps = st.lists(
    st.tuples(
        st.sampled_from(["reasoning", "content", "f", "ns__f"]),
        st.text(alphabet='ab {}"é', max_size=6),
    ),
    max_size=12,
)


def expected_items(plan: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Independent model: runs of one text channel merge; each tool call is its own Item."""
    out: list[tuple[str, str]] = []
    for kind, text in plan:
        if kind in ("reasoning", "content"):
            if not text:
                continue
            if out and out[-1][0] == kind:
                out[-1] = (kind, out[-1][1] + text)
            else:
                out.append((kind, text))
        else:
            out.append((kind, text))
    return out


@settings(max_examples=150, deadline=None)
@given(plan=steps, incomplete=st.booleans())
def test_stream_events_rebuild_the_terminal_items(plan: list[Any], incomplete: bool) -> None:
    builder = OutputBuilder(identity)
    status = ResponseStatus.INCOMPLETE if incomplete else ResponseStatus.COMPLETED
    raw = [e for step in plan for e in feed(builder, step)] + builder.finish(status)
    events = EventSequencer().number(raw)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert all(list(e)[:2] == ["type", "sequence_number"] for e in events)

    # an independent replay of the event stream, as a client would do it
    added: dict[int, dict[str, Any]] = {}
    deltas: dict[str, list[str]] = {}
    done: dict[int, dict[str, Any]] = {}
    for e in events:
        kind = e["type"]
        if kind == "response.output_item.added":
            assert e["output_index"] == len(added)  # indices rise by one, in order
            added[e["output_index"]] = e["item"]
            deltas[e["item"]["id"]] = []
            assert e["item"]["status"] == "in_progress"
        elif kind.endswith(".delta"):
            assert e["item_id"] == added[e["output_index"]]["id"]
            assert e["output_index"] not in done
            deltas[e["item_id"]].append(e["delta"])
        elif kind in ("response.output_text.done", "response.reasoning_text.done"):
            assert e["text"] == "".join(deltas[e["item_id"]])
        elif kind == "response.function_call_arguments.done":
            assert e["arguments"] == "".join(deltas[e["item_id"]])
        elif kind == "response.output_item.done":
            done[e["output_index"]] = e["item"]
    assert sorted(done) == sorted(added) == list(range(len(builder.output)))
    assert [done[i] for i in range(len(done))] == builder.output

    got = []
    for item in builder.output:
        text = "".join(deltas[item["id"]])
        if item["type"] == "function_call":
            assert item["arguments"] == text and item["status"] == "completed"
            assert item["id"].startswith("fc_") and item["call_id"].startswith("call_")
            namespace = item.get("namespace")
            engine_name = item["name"] if namespace is None else f"{namespace}__{item['name']}"
            assert identity(engine_name) == (namespace, item["name"])
            got.append((engine_name, text))
        else:
            assert item["content"][0]["text"] == text
            kind = "reasoning" if item["type"] == "reasoning" else "content"
            got.append((kind, text))
    assert got == expected_items(plan)
    text_items = [i for i in builder.output if i["type"] != "function_call"]
    if text_items and incomplete and builder.output[-1] is text_items[-1]:
        assert text_items[-1]["status"] == "incomplete"  # the Item open at the cut
    assert all(i["status"] == "completed" for i in builder.output[:-1])


def test_namespace_is_restored_on_tool_call_items() -> None:
    builder = OutputBuilder(identity)
    events = builder.tool_call("ns__f", '{"x": 1}')
    item = builder.output[0]
    assert (item["namespace"], item["name"], item["arguments"]) == ("ns", "f", '{"x": 1}')
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    assert events[0]["item"]["arguments"] == "" and events[0]["item"]["namespace"] == "ns"
    assert "namespace" not in OutputBuilder(identity).tool_call("g", "{}")[0]["item"]


def test_text_item_event_lifecycle() -> None:
    builder = OutputBuilder(identity)
    events = builder.reasoning("r") + builder.content("a") + builder.content("b")
    events += builder.finish(ResponseStatus.COMPLETED)
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    reasoning, message = builder.output
    assert reasoning["summary"] == [] and reasoning["content"] == [
        {"type": "reasoning_text", "text": "r"}
    ]
    assert message["role"] == "assistant" and message["content"][0]["text"] == "ab"
    assert message["content"][0]["annotations"] == []


def test_reasoning_only_incomplete_has_no_invented_message() -> None:
    builder = OutputBuilder(identity)
    builder.reasoning("thinking")
    builder.finish(ResponseStatus.INCOMPLETE)
    assert [i["type"] for i in builder.output] == ["reasoning"]
    assert builder.output[0]["status"] == "incomplete"


def test_status_and_usage() -> None:
    assert status_for("stop") == ResponseStatus.COMPLETED
    assert status_for("length") == status_for("context") == ResponseStatus.INCOMPLETE
    usage = ResponseUsage(42, 12, 17, 5).to_dict()
    assert usage == {
        "input_tokens": 42,
        "input_tokens_details": {"cached_tokens": 17},
        "output_tokens": 12,
        "output_tokens_details": {"reasoning_tokens": 5},
        "total_tokens": 54,
    }


def test_response_object_echoes_request_settings() -> None:
    req = parse_responses_request(
        {"model": "m", "input": "x", "instructions": "i", "metadata": {"a": "b"}, "top_p": 0.5}
    )
    common = {"response_id": "resp_1", "created_at": 1, "model": "m", "output": [], "request": req}
    done = response_object(
        status=ResponseStatus.COMPLETED, usage=ResponseUsage(1, 2), completed_at=5, **common
    )
    assert done["object"] == "response" and done["status"] == "completed"
    assert done["completed_at"] == 5 and done["incomplete_details"] is None
    assert done["instructions"] == "i" and done["metadata"] == {"a": "b"}
    assert done["top_p"] == 0.5 and done["max_output_tokens"] is None
    assert done["service_tier"] == "default" and "output_text" not in done
    cut = response_object(
        status=ResponseStatus.INCOMPLETE, usage=ResponseUsage(1, 2), completed_at=5, **common
    )
    assert cut["completed_at"] is None
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"}
    json.dumps(done)  # the wire object is plain JSON
