"""`ninfer serve` on the demo artifact, driven by the official openai SDK and raw HTTP.

The demo model has random weights, so tests assert protocol shape, accounting and determinism,
never text content.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import openai
import pytest

from e2e.serve_process import MODEL_ID, ServeProcess, serve, sse_events

pytestmark = pytest.mark.e2e

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    # The default 30 s pending timeout: on a loaded machine an idle server may still take a
    # moment to admit, and no test here may depend on machine speed (the 503 test has its own).
    with serve() as s:
        yield s


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


# -- OpenAI SDK ---------------------------------------------------------------------------------


def test_sdk_aggregate_completion_shape_and_usage(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=6, seed=1)
    choice = out.choices[0]
    assert out.object == "chat.completion" and out.model == MODEL_ID
    assert choice.finish_reason == "length"
    assert choice.logprobs is None and choice.message.refusal is None
    usage = out.usage
    assert usage is not None and usage.completion_tokens == 6
    assert usage.total_tokens == usage.prompt_tokens + 6
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert usage.completion_tokens_details is not None
    # thinking is on by default and a random model never closes </think> in 6 tokens
    assert usage.completion_tokens_details.reasoning_tokens == 6
    extra = out.model_extra or {}
    timings = extra["timings"]
    assert timings["prompt_n"] + timings["cache_n"] == usage.prompt_tokens
    assert timings["predicted_n"] == 6


def test_sdk_stream_with_usage_matches_aggregate(client: openai.OpenAI) -> None:
    kwargs = {"model": MODEL_ID, "messages": HELLO, "max_tokens": 8, "seed": 7}
    aggregate = client.chat.completions.create(**kwargs)
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    reasoning = "".join(
        (c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        for c in chunks
        if c.choices
    )
    agg_extra = aggregate.choices[0].message.model_extra or {}
    assert reasoning == agg_extra.get("reasoning_content", "")
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finish] == ["length"]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == aggregate.usage.completion_tokens == 8
    assert "timings" in (last.model_extra or {})
    assert all(c.usage is None for c in chunks[:-1])


def test_sdk_same_seed_reproduces_and_other_seed_differs(client: openai.OpenAI) -> None:
    def run(seed: int) -> str:
        out = client.chat.completions.create(
            model=MODEL_ID, messages=HELLO, max_tokens=12, seed=seed, temperature=1.0
        )
        return (out.choices[0].message.model_extra or {}).get("reasoning_content", "")

    first = run(11)
    assert run(11) == first
    assert run(12) != first


def test_sdk_max_tokens_zero_processes_prompt_only(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=0)
    assert out.usage is not None and out.usage.completion_tokens == 0
    assert out.usage.prompt_tokens > 0
    assert out.choices[0].message.content == ""
    assert out.choices[0].finish_reason == "length"


def test_sdk_stop_string_ends_generation_and_is_withheld(client: openai.OpenAI) -> None:
    base = client.chat.completions.create(
        model=MODEL_ID, messages=HELLO, max_tokens=16, seed=5, temperature=1.0
    )
    text = (base.choices[0].message.model_extra or {})["reasoning_content"]
    stop = text[len(text) // 2 :][:3].strip() or text[-2:]
    out = client.chat.completions.create(
        model=MODEL_ID, messages=HELLO, max_tokens=16, seed=5, temperature=1.0, stop=[stop]
    )
    stopped = (out.choices[0].message.model_extra or {}).get("reasoning_content", "")
    assert out.choices[0].finish_reason == "stop"
    assert stop not in stopped
    assert text.startswith(stopped)
    assert out.usage is not None and out.usage.completion_tokens < 16


def test_sdk_wrong_model_is_404(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="nope", messages=HELLO, max_tokens=1)
    assert info.value.body["code"] == "model_not_found"  # type: ignore[index]


def test_sdk_models_list_and_get(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    model = client.models.retrieve(MODEL_ID)
    assert (model.model_extra or {})["max_model_len"] == 512


# -- raw HTTP -------------------------------------------------------------------------------------


def test_health_and_request_ids(server: ServeProcess) -> None:
    status, headers, body = server.request("GET", "/health")
    assert (status, body) == (200, {"status": "ok"})
    ids = set()
    for method, path, payload in [
        ("GET", "/v1/models", None),
        ("GET", "/v1/models/other", None),
        ("POST", CHAT, {"model": MODEL_ID, "messages": HELLO, "max_tokens": 1}),
        ("POST", CHAT, {"model": MODEL_ID}),
        ("GET", "/no/such/path", None),
    ]:
        _, headers, _ = server.request(method, path, payload)
        ids.add(headers["x-request-id"])
    assert len(ids) == 5


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"model": MODEL_ID}, 400, "missing_required_parameter", "messages"),
        ({"model": MODEL_ID, "messages": HELLO, "n": 2}, 400, "unsupported_value", "n"),
        ({"model": MODEL_ID, "messages": HELLO, "top_k": 21}, 400, "invalid_value", "top_k"),
        ({"model": MODEL_ID, "messages": HELLO, "logprobs": True}, 400, None, "logprobs"),
        (
            {
                "model": MODEL_ID,
                "messages": HELLO,
                "enable_thinking": True,
                "reasoning_effort": "none",
            },
            400,
            "conflicting_template_option",
            "chat_template_kwargs",
        ),
        ({"model": "other", "messages": HELLO}, 404, "model_not_found", "model"),
    ],
    ids=["no-messages", "n2", "top_k", "logprobs", "thinking-conflict", "model"],
)
def test_error_bodies_are_openai_shaped(
    server: ServeProcess, body: dict, status: int, code: str | None, param: str
) -> None:
    got, headers, payload = server.request("POST", CHAT, body)
    assert got == status
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["param"] == param
    if code is not None:
        assert payload["error"]["code"] == code
    assert headers["x-request-id"].startswith("req-")


def test_invalid_json_is_400(server: ServeProcess) -> None:
    status, _, payload = server.request("POST", CHAT, raw=b"{not json")
    assert status == 400 and "JSON" in payload["error"]["message"]


def test_context_length_exceeded_reports_counts(server: ServeProcess) -> None:
    long = [{"role": "user", "content": "word " * 600}]
    status, _, payload = server.request("POST", CHAT, {"model": MODEL_ID, "messages": long})
    assert status == 400
    assert payload["error"]["code"] == "context_length_exceeded"
    assert "512" in payload["error"]["message"]


def test_stream_progress_and_per_token_timings(server: ServeProcess) -> None:
    conn = server.connection()
    body = {
        "model": MODEL_ID,
        "messages": HELLO,
        "max_tokens": 3,
        "seed": 7,  # the length finish below must not hang on a sampled EOS
        "stream": True,
        "return_progress": True,
        "timings_per_token": True,
    }
    conn.request("POST", CHAT, body=json.dumps(body), headers={"content-type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("x-request-id")
    assert resp.getheader("content-type").startswith("text/event-stream")
    lines = list(sse_events(resp))
    conn.close()
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    # the initial event has processed == cache (HELLO was sent before: its prefix is reused)
    assert progress[0]["processed"] == progress[0]["cache"] < progress[0]["total"]
    assert progress[-1]["processed"] == progress[-1]["total"] > 0
    text_chunks = [
        c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("reasoning_content")
    ]
    counts = [c["timings"]["predicted_n"] for c in text_chunks]
    assert counts == sorted(counts) and counts[-1] <= 3
    assert "timings" in chunks[-1] and chunks[-1]["choices"][0]["finish_reason"] == "length"
    # every snapshot is the engine's, on the terminal timings' clock: prompt time runs from the
    # committed admission to the first token, so it is one number for the whole stream
    final = chunks[-1]["timings"]
    for c in text_chunks:
        snap = c["timings"]
        assert (snap["cache_n"], snap["prompt_n"]) == (final["cache_n"], final["prompt_n"])
        assert snap["prompt_ms"] == final["prompt_ms"]
        assert snap["predicted_ms"] <= final["predicted_ms"]
    first_text = chunks.index(text_chunks[0])
    assert all("prompt_progress" not in c for c in chunks[first_text:])


def test_unsupported_serve_flag_exits_2() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ninfer.cli.app", "serve", "--spec", "dflash"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "--spec" in out.stderr and "not supported yet" in out.stderr


def test_queue_timeout_is_503_and_disconnect_is_logged() -> None:
    # Its own server: a short pending timeout only where a timeout is the expected outcome.
    with serve("--pending-timeout-ms", "1000") as server:
        _queue_timeout_and_disconnect(server)


def _queue_timeout_and_disconnect(server: ServeProcess) -> None:
    conn = server.connection()
    body = {"model": MODEL_ID, "messages": HELLO, "max_tokens": 4000, "stream": True}
    conn.request("POST", CHAT, body=json.dumps(body), headers={"content-type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    lines = sse_events(resp)
    while "reasoning_content" not in next(lines):  # the only lane is now decoding
        pass
    status, headers, err = server.request(
        "POST", CHAT, {"model": MODEL_ID, "messages": HELLO, "max_tokens": 1}
    )
    assert status == 503 and err["error"]["code"] == "request_queue_timeout"
    assert headers["x-request-id"].startswith("req-")
    conn.close()
    line = server.wait_for_log("delivery=client_gone")
    assert "status=499" in line


@pytest.mark.parametrize(
    "extra",
    [
        {"reasoning_effort": "none"},
        {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
    ],
    ids=["effort-none", "template-kwargs"],
)
def test_thinking_off_puts_output_in_content(client: openai.OpenAI, extra: dict) -> None:
    out = client.chat.completions.create(
        model=MODEL_ID, messages=HELLO, max_tokens=5, seed=2, **extra
    )
    message = out.choices[0].message
    assert message.content  # a random model still writes something
    assert "reasoning_content" not in (message.model_extra or {})
    assert out.usage is not None and out.usage.completion_tokens_details is not None
    assert out.usage.completion_tokens_details.reasoning_tokens == 0
