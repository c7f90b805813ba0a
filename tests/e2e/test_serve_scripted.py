"""Chat Completions protocol behaviour with a scripted model behind the real engine and server.

The scripted runner (tests/support/scripted_runner.py) emits exact outputs chosen by a trigger in
the prompt, so reasoning, tool calls, stops and concurrency can be asserted exactly, with the
official openai SDK and raw HTTP against a live server on 127.0.0.1.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import openai
import pytest

from e2e.serve_process import MODEL_ID, ServeProcess, serve, sse_events

pytestmark = pytest.mark.e2e
CHAT = "/v1/chat/completions"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    with serve("--step-delay", "0.02", scripted=True) as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_reasoning_content_and_content(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL_ID, messages=_ask("REASON please"))
    msg = r.choices[0].message
    assert msg.content == "The answer is 42."
    assert msg.model_extra["reasoning_content"] == "Let me think about it."
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens_details.reasoning_tokens > 0
    assert r.usage.completion_tokens > r.usage.completion_tokens_details.reasoning_tokens


def test_ignore_eos_generates_to_max_tokens(client: openai.OpenAI) -> None:
    # vLLM's ignore_eos (benchmark clients send it): the script ends its turn after a few
    # tokens; with the flag the request runs on to max_tokens and finishes by length
    ended = client.chat.completions.create(
        model=MODEL_ID, messages=_ask("REASON please"), max_tokens=60
    )
    assert ended.choices[0].finish_reason == "stop" and ended.usage.completion_tokens < 60
    through = client.chat.completions.create(
        model=MODEL_ID,
        messages=_ask("REASON please"),
        max_tokens=60,
        extra_body={"ignore_eos": True},
    )
    assert through.choices[0].finish_reason == "length"
    assert through.usage.completion_tokens == 60


def test_tool_call_round_trip(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model=MODEL_ID, messages=_ask("WEATHER? in Paris"), tools=[WEATHER_TOOL]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}  # typed by schema
    assert call.id
    history = _ask("WEATHER? in Paris") + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "TOOL_RESULT_SUNNY"},
    ]
    second = client.chat.completions.create(model=MODEL_ID, messages=history, tools=[WEATHER_TOOL])
    assert second.choices[0].message.content == "It is sunny in Paris."
    assert second.choices[0].finish_reason == "stop"


def test_streamed_tool_call_matches_aggregate(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL_ID, messages=_ask("WEATHER?"), tools=[WEATHER_TOOL], stream=True
    )
    names, args, finish, reasoning = [], "", None, ""
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        for tc in delta.tool_calls or []:
            if tc.function and tc.function.name:
                names.append(tc.function.name)
            args += (tc.function.arguments or "") if tc.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert names == ["get_weather"]
    assert json.loads(args) == {"city": "Paris", "days": 3}
    assert finish == "tool_calls"
    assert reasoning == "The user wants the weather; call the tool."


def test_stop_string_cuts_content(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL_ID, messages=_ask("STOPWORD"), stop=["STOP"])
    assert r.choices[0].message.content == "alpha beta "
    assert r.choices[0].finish_reason == "stop"


def _stream(server: ServeProcess, text: str, out: dict, key: str, *, disconnect: bool = False):
    conn = server.connection(timeout=60)
    body = {"model": MODEL_ID, "messages": _ask(text), "stream": True}
    conn.request("POST", CHAT, body=json.dumps(body), headers={"content-type": "application/json"})
    resp = conn.getresponse()
    out[key] = {"status": resp.status, "content": ""}
    if resp.status != 200:
        resp.read()
        conn.close()
        return
    for line in sse_events(resp):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for c in chunk.get("choices", []):
            out[key]["content"] += c["delta"].get("content") or ""
        if disconnect and out[key]["content"]:
            break
    conn.close()


def test_24_concurrent_streams_overload_isolation_and_disconnects() -> None:
    with serve(
        "--max-concurrency",
        "2",
        "--max-pending-requests",
        "4",
        "--step-delay",
        "0.03",
        scripted=True,
    ) as server:
        results: dict[str, dict] = {}
        threads = [
            threading.Thread(target=_stream, args=(server, f"hi from client-{i}", results, str(i)))
            for i in range(24)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        statuses = [results[str(i)]["status"] for i in range(24)]
        assert set(statuses) <= {200, 429}
        assert statuses.count(429) >= 1 and statuses.count(200) >= 6
        for i in range(24):
            if statuses[i] == 200:  # exactly its own words, never another client's
                assert results[str(i)]["content"] == " ".join([f"client-{i}"] * 12)

        # six long streams fill 2 lanes + 4 pending; each disconnects after its first content
        long: dict[str, dict] = {}
        threads = [
            threading.Thread(
                target=_stream, args=(server, "LONG", long, str(i)), kwargs={"disconnect": True}
            )
            for i in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [long[str(i)]["status"] for i in range(6)] == [200] * 6
        follow: dict[str, dict] = {}
        t0 = time.monotonic()
        _stream(server, "hi from client-99", follow, "x")
        assert follow["x"]["status"] == 200  # the disconnected clients' lanes were freed
        assert follow["x"]["content"] == " ".join(["client-99"] * 12)
        assert time.monotonic() - t0 < 20


def test_keep_alive_comment_while_the_engine_is_slow() -> None:
    with serve("--first-token-delay", "6", scripted=True) as server:
        conn = server.connection(timeout=60)
        body = {"model": MODEL_ID, "messages": _ask("SLOW"), "stream": True}
        conn.request(
            "POST", CHAT, body=json.dumps(body), headers={"content-type": "application/json"}
        )
        resp = conn.getresponse()
        lines = list(sse_events(resp))
        conn.close()
    assert ": keep-alive" in lines
    data = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    first_content = next(i for i, x in enumerate(lines) if '"content"' in x and "done" in x)
    assert lines.index(": keep-alive") < first_content
    assert lines[-1] == "data: [DONE]"
    assert "".join(c["delta"].get("content") or "" for d in data for c in d["choices"]) == "done"
