"""OpenAI Responses against a live server: the official openai SDK and raw HTTP/SSE.

Exact outputs come from the scripted model (tests/support/scripted_serve.py): reasoning, function
calls, namespaced calls, and PROBE_HISTORY, which reports which markers reached the prompt (so
history reconstruction, instructions and preserved reasoning are observable). Store bounds run on
the real `ninfer serve`, whose random output does not matter there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from e2e.serve_process import MODEL_ID, ServeProcess, serve, sse_events

pytestmark = pytest.mark.e2e
RESPONSES = "/v1/responses"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather forecast",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
    "strict": False,
}
MCP_WEATHER = {
    "type": "namespace",
    "name": "mcp__weather",
    "description": "Weather service",
    "tools": [
        {
            "type": "function",
            "name": "get_current",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ],
}


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    with serve(scripted=True) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def probe(text: str) -> dict[str, bool]:
    """PROBE_HISTORY's answer: marker -> whether it was in the prompt."""
    pairs = (word.split("=") for word in text.split())
    return {name.upper(): value == "yes" for name, value in pairs}


def stream_events(server: ServeProcess, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(event name, JSON) pairs of a raw Responses SSE stream; asserts the framing."""
    conn = server.connection()
    conn.request(
        "POST",
        RESPONSES,
        json.dumps({**body, "stream": True}),
        {"content-type": "application/json"},
    )
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("content-type", "").startswith("text/event-stream")
    assert resp.getheader("x-request-id")
    events, name = [], None
    for line in sse_events(resp):
        assert line != "data: [DONE]"
        if line.startswith(":"):
            continue
        if line.startswith("event: "):
            assert name is None
            name = line.removeprefix("event: ")
            continue
        assert line.startswith("data: ") and name is not None
        events.append((name, json.loads(line.removeprefix("data: "))))
        name = None
    conn.close()
    return events


def check_stream(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Validate one stream event by event against the spec; returns the terminal Response."""
    assert [n for n, _ in events] == [e["type"] for _, e in events]
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    types = [n for n, _ in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    terminal = {"response.completed", "response.incomplete", "response.failed"}
    assert types[-1] in terminal and not terminal & set(types[:-1])
    created = events[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    final = events[-1][1]["response"]
    assert final["id"] == created["id"] == events[1][1]["response"]["id"]

    open_items: dict[int, dict[str, Any]] = {}
    texts: dict[int, list[str]] = {}
    parts_open: set[int] = set()
    done_items: list[dict[str, Any]] = []
    for name, e in events[2:-1]:
        index = e.get("output_index")
        if name == "response.output_item.added":
            assert index == len(done_items) and not open_items  # one Item at a time, in order
            open_items[index] = e["item"]
            texts[index] = []
        elif name == "response.content_part.added":
            assert index in open_items and e["content_index"] == 0 and e["part"]["text"] == ""
            assert e["item_id"] == open_items[index]["id"]
            parts_open.add(index)
        elif name in ("response.output_text.delta", "response.reasoning_text.delta"):
            assert index in parts_open and e["item_id"] == open_items[index]["id"]
            kind = "message" if "output_text" in name else "reasoning"
            assert open_items[index]["type"] == kind
            texts[index].append(e["delta"])
        elif name == "response.function_call_arguments.delta":
            assert open_items[index]["type"] == "function_call"
            texts[index].append(e["delta"])
        elif name in ("response.output_text.done", "response.reasoning_text.done"):
            assert e["text"] == "".join(texts[index])
        elif name == "response.function_call_arguments.done":
            assert e["arguments"] == "".join(texts[index])
        elif name == "response.content_part.done":
            parts_open.remove(index)
            assert e["part"]["text"] == "".join(texts[index])
        elif name == "response.output_item.done":
            assert index not in parts_open and e["item"]["id"] == open_items.pop(index)["id"]
            done_items.append(e["item"])
        else:
            raise AssertionError(f"unexpected event {name}")
    assert not open_items and done_items == final["output"]
    for index, item in enumerate(final["output"]):
        joined = "".join(texts[index])
        if item["type"] == "function_call":
            assert item["arguments"] == joined
        else:
            assert item["content"][0]["text"] == joined
    return final


# -- create, store, retrieve -----------------------------------------------------------------------


def test_aggregate_reasoning_and_text_then_retrieve_list_delete(client: openai.OpenAI) -> None:
    r = client.responses.create(
        model=MODEL_ID, instructions="Answer.", input="REASON please", metadata={"k": "v"}
    )
    assert r.object == "response" and r.status == "completed" and r.model == MODEL_ID
    assert r.id.startswith("resp_") and r.completed_at is not None and r.error is None
    assert [item.type for item in r.output] == ["reasoning", "message"]
    reasoning, message = r.output
    assert reasoning.content[0].text == "Let me think about it." and reasoning.summary == []
    assert reasoning.id.startswith("rs_") and message.id.startswith("msg_")
    assert r.output_text == "The answer is 42."
    assert r.instructions == "Answer." and r.metadata == {"k": "v"} and r.store is True
    u = r.usage
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert 0 < u.output_tokens_details.reasoning_tokens < u.output_tokens
    assert u.input_tokens_details.cached_tokens == 0

    got = client.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    items = client.responses.input_items.list(r.id)
    (item,) = items.data
    assert item.type == "message" and item.role == "user"
    assert item.content[0].type == "input_text" and item.content[0].text == "REASON please"

    deleted = client.responses.delete(r.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.retrieve(r.id)
    assert info.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)


def test_wire_body_has_no_output_text_and_delete_body(server: ServeProcess) -> None:
    status, headers, body = server.request(
        "POST", RESPONSES, {"model": MODEL_ID, "input": "REASON"}
    )
    assert status == 200 and headers["x-request-id"]
    assert "output_text" not in body and body["max_output_tokens"] is None
    status, _, deleted = server.request("DELETE", f"{RESPONSES}/{body['id']}")
    assert (status, deleted) == (
        200,
        {"id": body["id"], "object": "response.deleted", "deleted": True},
    )


def test_incomplete_reasoning_only_result(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL_ID, input="REASON", max_output_tokens=3)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.completed_at is None and r.max_output_tokens == 3
    assert [i.type for i in r.output] == ["reasoning"]  # no invented empty message
    assert r.output[0].status == "incomplete" and r.usage.output_tokens == 3
    assert client.responses.retrieve(r.id).status == "incomplete"


def test_store_false_is_not_retrievable_or_continuable(
    client: openai.OpenAI, server: ServeProcess
) -> None:
    r = client.responses.create(model=MODEL_ID, input="REASON", store=False)
    assert r.store is False and r.output_text == "The answer is 42."
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.retrieve(r.id)
    assert info.value.code == "response_not_found"
    status, _, body = server.request(
        "POST", RESPONSES, {"model": MODEL_ID, "input": "x", "previous_response_id": r.id}
    )
    assert status == 404
    assert body["error"]["code"] == "response_not_found"
    assert body["error"]["param"] == "previous_response_id"


# -- tools and chains ------------------------------------------------------------------------------


def test_function_call_chain_with_previous_response_id(client: openai.OpenAI) -> None:
    first = client.responses.create(model=MODEL_ID, input="WEATHER? in Paris", tools=[WEATHER_TOOL])
    assert [i.type for i in first.output] == ["reasoning", "function_call"]
    call = first.output[1]
    assert call.name == "get_weather" and call.status == "completed"
    assert json.loads(call.arguments) == {"city": "Paris", "days": 3}
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert first.output_text == ""
    second = client.responses.create(
        model=MODEL_ID,
        previous_response_id=first.id,
        input=[
            {"type": "function_call_output", "call_id": call.call_id, "output": "TOOL_RESULT_SUNNY"}
        ],
        tools=[WEATHER_TOOL],
    )
    assert second.output_text == "It is sunny in Paris."
    assert second.previous_response_id == first.id
    # the parent stays retrievable; deleting it leaves the child's context usable
    client.responses.delete(first.id)
    third = client.responses.create(
        model=MODEL_ID, previous_response_id=second.id, input="TOOL_RESULT_SUNNY again"
    )
    assert third.status == "completed"


def test_namespaced_call_restores_namespace_and_replays(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL_ID, input="FORECAST_NS Oslo", tools=[MCP_WEATHER])
    call = r.output[-1]
    assert call.type == "function_call"
    assert (call.namespace, call.name) == ("mcp__weather", "get_current")
    assert json.loads(call.arguments) == {"city": "Oslo"}
    # stateless replay of the SDK's own output Items (store:false, no previous_response_id)
    replay = [
        {"role": "user", "content": "FORECAST_NS Oslo"},
        *[item.model_dump(exclude_none=True) for item in r.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "TOOL_RESULT_SUNNY"},
    ]
    again = client.responses.create(model=MODEL_ID, input=replay, tools=[MCP_WEATHER], store=False)
    assert again.output_text == "It is sunny in Paris."


def test_streamed_function_call(client: openai.OpenAI) -> None:
    stream = client.responses.create(
        model=MODEL_ID, input="WEATHER? in Paris", tools=[WEATHER_TOOL], stream=True
    )
    events = list(stream)
    types = [e.type for e in events]
    assert "response.function_call_arguments.delta" in types
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == {"city": "Paris", "days": 3}
    final = events[-1].response
    assert events[-1].type == "response.completed"
    assert final.output[-1].call_id.startswith("call_") and final.output[-1].name == "get_weather"


def test_history_instructions_and_preserved_reasoning(client: openai.OpenAI) -> None:
    parent = client.responses.create(
        model=MODEL_ID,
        instructions="SECRET_INSTR",
        input="FIRST_TURN",
        extra_body={"preserve_thinking": True},
    )
    assert parent.output_text == "first answer"
    child = client.responses.create(
        model=MODEL_ID,
        previous_response_id=parent.id,
        instructions="NEW_INSTR",
        input="PROBE_HISTORY",
    )
    seen = probe(child.output_text)
    # history reconstructed; old instructions dropped, new ones used; preserve_thinking inherited
    assert seen == {
        "SECRET_INSTR": False,
        "NEW_INSTR": True,
        "FIRST_TURN": True,
        "THOUGHT_MARK": True,
    }
    branch = client.responses.create(
        model=MODEL_ID,
        previous_response_id=parent.id,
        input="PROBE_HISTORY",
        extra_body={"preserve_thinking": False},
    )
    assert probe(branch.output_text)["THOUGHT_MARK"] is False
    grandchild = client.responses.create(
        model=MODEL_ID, previous_response_id=branch.id, input="PROBE_HISTORY again"
    )
    assert probe(grandchild.output_text)["THOUGHT_MARK"] is False  # the branch's value inherited


def test_input_tokens_matches_create_usage(client: openai.OpenAI, server: ServeProcess) -> None:
    kwargs: dict[str, Any] = {"model": MODEL_ID, "instructions": "Be brief.", "input": "REASON x"}
    count = client.responses.input_tokens.count(**kwargs)
    created = client.responses.create(**kwargs)
    assert count.input_tokens == created.usage.input_tokens
    chained = {"model": MODEL_ID, "previous_response_id": created.id, "input": "REASON again"}
    count = client.responses.input_tokens.count(**chained)
    assert count.input_tokens == client.responses.create(**chained).usage.input_tokens
    status, _, body = server.request("POST", f"{RESPONSES}/input_tokens", {"input": "Count this."})
    assert status == 200 and body["object"] == "response.input_tokens" and body["input_tokens"] > 0


# -- SSE -------------------------------------------------------------------------------------------


def test_stream_lifecycle_matches_stored_response(server: ServeProcess) -> None:
    events = stream_events(server, {"model": MODEL_ID, "input": "REASON please"})
    final = check_stream(events)
    assert events[-1][0] == "response.completed"
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["output"][1]["content"][0]["text"] == "The answer is 42."
    status, _, stored = server.request("GET", f"{RESPONSES}/{final['id']}")
    assert status == 200 and stored == final


def test_stream_of_tool_call_and_incomplete(server: ServeProcess) -> None:
    final = check_stream(
        stream_events(server, {"model": MODEL_ID, "input": "WEATHER?", "tools": [WEATHER_TOOL]})
    )
    assert [i["type"] for i in final["output"]] == ["reasoning", "function_call"]
    events = stream_events(server, {"model": MODEL_ID, "input": "REASON", "max_output_tokens": 2})
    final = check_stream(events)
    assert events[-1][0] == "response.incomplete" and final["status"] == "incomplete"


def test_stream_admission_errors_stay_http_errors(server: ServeProcess) -> None:
    status, _, body = server.request(
        "POST", RESPONSES, {"model": MODEL_ID, "input": "x" * 20000, "stream": True}
    )
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"


# -- resources and rejections ----------------------------------------------------------------------


def test_input_items_pagination(client: openai.OpenAI, server: ServeProcess) -> None:
    items = [
        {"type": "message", "role": "developer", "content": "d", "id": "in_1"},
        {"type": "message", "role": "user", "content": "REASON a", "id": "in_2"},
        {"type": "message", "role": "user", "content": "b"},
    ]
    r = client.responses.create(model=MODEL_ID, input=items)
    page = client.responses.input_items.list(r.id, limit=2, order="asc")
    assert [i.id for i in page.data] == ["in_1", "in_2"] and page.has_more
    rest = client.responses.input_items.list(r.id, limit=2, order="asc", after="in_2")
    assert len(rest.data) == 1 and rest.data[0].id.startswith("msg_") and not rest.has_more
    desc = client.responses.input_items.list(r.id)
    assert [i.id for i in desc.data] == [rest.data[0].id, "in_2", "in_1"]
    for query, param in [("limit=0", "limit"), ("limit=101", "limit"), ("order=up", "order"),
                         ("after=nope", "after")]:  # fmt: skip
        status, _, body = server.request("GET", f"{RESPONSES}/{r.id}/input_items?{query}")
        assert status == 400 and body["error"]["param"] == param


@pytest.mark.parametrize(
    ("path", "method", "status", "code"),
    [
        ("/v1/responses/resp_x/cancel", "POST", 400, "background_not_supported"),
        ("/v1/responses/compact", "POST", 400, "compaction_not_supported"),
        ("/v1/responses/resp_missing", "GET", 404, "response_not_found"),
        ("/v1/responses/resp_missing/input_items", "GET", 404, "response_not_found"),
        ("/v1/responses/resp_missing", "DELETE", 404, "response_not_found"),
    ],
)
def test_resource_errors(
    server: ServeProcess, path: str, method: str, status: int, code: str
) -> None:
    got, headers, body = server.request(method, path, {} if method == "POST" else None)
    assert got == status and body["error"]["code"] == code and headers["x-request-id"]


def test_retrieve_rejects_stream_recovery_and_include(server: ServeProcess) -> None:
    _, _, r = server.request("POST", RESPONSES, {"model": MODEL_ID, "input": "REASON"})
    for query, param in [("stream=true", "stream"), ("include=x", "include")]:
        status, _, body = server.request("GET", f"{RESPONSES}/{r['id']}?{query}")
        assert status == 400 and body["error"]["param"] == param


USER_Q = {"role": "user", "content": "q"}
ORPHAN_RESULT = {"type": "function_call_output", "call_id": "c", "output": "o"}
BAD_ORDER = [USER_Q, {"role": "assistant", "content": "a"}, {"type": "reasoning", "content": []}]
SAME_IDS = [{**USER_Q, "id": "d"}, {**USER_Q, "id": "d"}]
IMAGE = [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]
UNSUPPORTED = "unsupported_parameter"


@pytest.mark.parametrize(
    ("fields", "status", "param", "code"),
    [
        ({"seed": 3}, 400, "seed", "unknown_parameter"),
        ({"model": "other"}, 404, "model", "model_not_found"),
        ({"input": []}, 400, "input", "missing_required_parameter"),
        ({"background": True}, 400, "background", UNSUPPORTED),
        ({"tools": [{"type": "computer_use_2099"}]}, 400, "tools[0].type", UNSUPPORTED),
        ({"tools": [{**WEATHER_TOOL, "strict": True}]}, 400, "tools[0].strict", UNSUPPORTED),
        ({"tool_choice": "required", "tools": [WEATHER_TOOL]}, 400, "tool_choice", UNSUPPORTED),
        ({"text": {"format": {"type": "json_schema"}}}, 400, "text.format", UNSUPPORTED),
        ({"include": ["message.output_text.logprobs"]}, 400, "include[0]", UNSUPPORTED),
        ({"truncation": "auto"}, 400, "truncation", UNSUPPORTED),
        ({"conversation": "c"}, 400, "conversation", UNSUPPORTED),
        ({"temperature": 3}, 400, "temperature", "invalid_value"),
        ({"input": [USER_Q, ORPHAN_RESULT]}, 400, "input[1]", "invalid_tool_history"),
        ({"input": BAD_ORDER}, 400, "input[2]", "invalid_assistant_history"),
        ({"input": SAME_IDS}, 400, "input[1].id", "duplicate_id"),
        ({"input": IMAGE}, 400, "input[0].content[0]", "vision_disabled"),
        ({"previous_response_id": "resp_nope"}, 404, "previous_response_id", "response_not_found"),
    ],
)
def test_create_rejections(
    server: ServeProcess, fields: dict[str, Any], status: int, param: str, code: str
) -> None:
    got, headers, body = server.request(
        "POST", RESPONSES, {"model": MODEL_ID, "input": "hi", **fields}
    )
    assert (got, body["error"]["param"], body["error"]["code"]) == (status, param, code)
    assert headers["x-request-id"]


# -- store bounds (real model) ---------------------------------------------------------------------


def test_store_bounds_evict_and_report_capacity() -> None:
    with serve("--response-store-max-records", "2", "--response-store-max-mib", "1") as s:
        base = {"model": MODEL_ID, "max_output_tokens": 1}
        ids = [
            s.request("POST", RESPONSES, {**base, "input": f"hello {i}"})[2]["id"] for i in range(3)
        ]
        assert s.request("GET", f"{RESPONSES}/{ids[0]}")[0] == 404  # least recently used: evicted
        assert [s.request("GET", f"{RESPONSES}/{i}")[0] for i in ids[1:]] == [200, 200]
        big = {**base, "input": "word " * 250_000}  # ~1.2 MiB of Items: more than the whole store
        status, _, body = s.request("POST", RESPONSES, big)
        assert status == 400 and body["error"]["code"] == "response_store_capacity_exceeded"
        assert [s.request("GET", f"{RESPONSES}/{i}")[0] for i in ids[1:]] == [200, 200]
