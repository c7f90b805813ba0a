"""Observability of a live `ninfer serve`: /metrics, the JSONL request log, throughput records,
the operational log and the shutdown drain, after a known mix of requests from the official
openai and anthropic SDKs.

The demo model has random weights, so the expected values come from what the clients received
(usage, streamed text) and from the log's own per-request records, never from model text. The
counters must equal those sums exactly.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.serve_process import MODEL_ID, ServeProcess, serve
from ninfer.artifact.demo import ensure_demo
from ninfer.artifact.reader import Artifact
from ninfer.server.request_log import SCHEMA_PATH
from ninfer.tokenizer import Tokenizer

pytestmark = pytest.mark.e2e
KEY = "obs-secret-key"
AUTH = {"authorization": f"Bearer {KEY}"}
VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
HELLO = [{"role": "user", "content": "Say hello."}]
TERMINALS = ("request_done", "request_error")


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    with Artifact(ensure_demo()) as artifact:
        return Tokenizer.from_json(artifact.tokenizer_json)


def records(path) -> list[dict[str, Any]]:  # noqa: ANN001
    out = [json.loads(line) for line in path.read_text().splitlines()]
    for record in out:
        VALIDATOR.validate(record)
    return out


def scrape(server: ServeProcess) -> dict[str, float]:
    status, headers, _ = server.request("GET", "/metrics")
    assert status == 401  # the API key applies as on every other endpoint
    conn = server.connection()
    conn.request("GET", "/metrics", headers=AUTH)
    resp = conn.getresponse()
    text = resp.read().decode()
    assert resp.status == 200 and "version=0.0.4" in resp.getheader("content-type")
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


@pytest.fixture(scope="module")
def mix(tmp_path_factory, tokenizer) -> Iterator[dict[str, Any]]:
    """Run the mix once; tests read what it produced."""
    log = tmp_path_factory.mktemp("obs") / "requests.jsonl"
    args = ("--api-key", KEY, "--max-concurrency", "1", "--max-pending-requests", "0",
            "--seed", "5",  # requests without a seed are reproducible too
            "--request-log-jsonl", str(log), "--log-stats-interval-ms", "200")  # fmt: skip
    with serve(*args) as server:
        oa = openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0)
        an = anthropic.Anthropic(base_url=server.base_url, api_key=KEY, max_retries=0)
        got: dict[str, Any] = {"server": server, "log": log, "ids": [], "rejected": []}
        returned: dict[str, tuple[str, int]] = {}  # request id -> (text, completion tokens)

        def keep(request_id: str, text: str, completion: int) -> None:
            got["ids"].append(request_id)
            returned[request_id] = (text, completion)

        # Chat Completions, aggregate and streamed
        out = oa.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=6, seed=11)
        message = out.choices[0].message
        text = (message.model_extra or {}).get("reasoning_content", "") + (message.content or "")
        keep(out._request_id, text, out.usage.completion_tokens)
        stream = oa.chat.completions.create(
            model=MODEL_ID, messages=HELLO, max_tokens=7, seed=12, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        text, usage = "", None
        for chunk in stream:
            usage = chunk.usage or usage
            if chunk.choices:
                delta = chunk.choices[0].delta
                text += (delta.model_extra or {}).get("reasoning_content") or ""
                text += delta.content or ""
        keep(stream.response.headers["x-request-id"], text, usage.completion_tokens)
        # Responses
        resp = oa.responses.create(model=MODEL_ID, input="Say hello.", max_output_tokens=5)
        text = "".join(c.text for item in resp.output for c in (item.content or []))
        keep(resp._request_id, text, resp.usage.output_tokens)
        stream = oa.responses.create(
            model=MODEL_ID, input="Say hello.", max_output_tokens=4, stream=True
        )
        text, final = "", None
        for event in stream:
            if event.type in ("response.output_text.delta", "response.reasoning_text.delta"):
                text += event.delta
            if event.type == "response.completed" or event.type == "response.incomplete":
                final = event.response
        keep(stream.response.headers["x-request-id"], text, final.usage.output_tokens)
        # Anthropic Messages
        msg = an.messages.create(model=MODEL_ID, max_tokens=6, messages=HELLO)
        text = "".join(getattr(b, "thinking", "") or getattr(b, "text", "") for b in msg.content)
        keep(msg._request_id, text, msg.usage.output_tokens)
        stream = an.messages.create(model=MODEL_ID, max_tokens=5, messages=HELLO, stream=True)
        text, output = "", 0
        for event in stream:
            if event.type == "content_block_delta":
                text += getattr(event.delta, "thinking", "") or getattr(event.delta, "text", "")
            if event.type == "message_delta":
                output = event.usage.output_tokens
        keep(stream.response.headers["request-id"], text, output)
        # a preparation rejection: the prompt exceeds --max-context 512
        with pytest.raises(openai.BadRequestError) as info:
            oa.chat.completions.create(
                model=MODEL_ID, messages=[{"role": "user", "content": "word " * 600}]
            )
        assert info.value.code == "context_length_exceeded"
        got["rejected"].append((info.value.request_id, 400))
        # a client cancel, and a 429 while it holds the only lane
        stream = oa.chat.completions.create(
            model=MODEL_ID, messages=HELLO, max_tokens=300, seed=13, stream=True
        )
        cancelled_id = stream.response.headers["x-request-id"]
        seen = 0
        for chunk in stream:
            seen += bool(chunk.choices and chunk.choices[0].delta.model_extra)
            if seen == 3:
                break
        with pytest.raises(openai.RateLimitError) as busy:
            oa.chat.completions.create(model=MODEL_ID, messages=HELLO, max_tokens=1)
        got["rejected"].append((busy.value.request_id, 429))
        stream.close()  # the client goes away mid-stream
        got["ids"].append(cancelled_id)
        for request_id in got["ids"] + [rid for rid, _ in got["rejected"]]:
            server.settled(request_id)
        got["metrics"] = scrape(server)
        got["returned"] = returned
        got["cancelled_id"] = cancelled_id
        server.wait_for_log("throughput")
        # a stream in flight while the server stops: the drain lets it finish
        stream = oa.chat.completions.create(
            model=MODEL_ID, messages=HELLO, max_tokens=40, seed=14, stream=True
        )
        chunks = iter(stream)
        next(chunks)
        next(chunks)
        server.proc.send_signal(signal.SIGINT)
        got["drained_chunks"] = 2 + sum(1 for _ in chunks)
        assert server.proc.wait(timeout=60) == 0
        server.wait_for_log("shutdown drain")
        yield got


def test_every_metric_counts_the_mix_exactly(mix) -> None:
    m, log = mix["metrics"], records(mix["log"])
    mine = [r for r in log if r.get("request_id") in set(mix["ids"])]  # not the drain request
    done = {r["request_id"]: r for r in mine if r["event"] == "request_done"}
    started = [r for r in mine if r["event"] == "request_start"]
    assert len(done) == len(started) == 7  # six completed, one cancelled
    assert m["ninfer_requests_total{outcome=completed}"] == 6
    assert m["ninfer_requests_total{outcome=cancelled}"] == 1
    assert m["ninfer_requests_total{outcome=rejected}"] == 2
    assert m["ninfer_requests_total{outcome=failed}"] == 0
    assert m["ninfer_response_failures_total"] == 0
    generated = sum(r["usage"]["completion_tokens"] for r in done.values())
    clients = sum(completion for _, completion in mix["returned"].values())
    cancelled = done[mix["cancelled_id"]]["usage"]["completion_tokens"]
    assert generated == clients + cancelled  # the six the clients saw, plus the cancelled one
    assert m["ninfer_generation_tokens_total"] == generated
    assert m["ninfer_decode_tokens_total"] == generated - 7  # each first token is prefill's
    prompt = sum(r["usage"]["prompt_tokens"] for r in done.values())
    cached = sum(r["usage"]["cached_tokens"] for r in done.values())
    assert m["ninfer_prompt_tokens_total"] == prompt
    # repeated prompts of the mix hit the prefix cache: only the rest is computed
    assert m["ninfer_prompt_tokens_cached_total"] == cached
    assert m["ninfer_prefill_tokens_total"] == prompt - cached
    assert m["ninfer_decode_row_rounds_total"] == m["ninfer_decode_rounds_total"]  # one lane
    for name in ("time_to_first_token", "request_duration", "request_queue"):
        assert m[f"ninfer_{name}_seconds_count"] == 7
        assert m[f"ninfer_{name}_seconds_bucket{{le=+Inf}}"] == 7
    sums = {
        "request_duration": sum(r["timings_seconds"]["total"] for r in done.values()),
        "time_to_first_token": sum(r["timings_seconds"]["ttft"] for r in done.values()),
        "request_queue": sum(r["engine_timing"]["queue_wait_seconds"] for r in done.values()),
    }
    for name, expected in sums.items():
        assert m[f"ninfer_{name}_seconds_sum"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    gauges = ("running", "waiting", "prefilling", "decode_ready", "paused")
    assert all(m[f"ninfer_requests_{g}"] == 0 for g in gauges)
    # idle: what is still held is the prefix cache's retained history (the spec: retained
    # history also occupies these pools), never more than the pool
    assert 0 <= m["ninfer_device_kv_used_pages"] <= m["ninfer_device_kv_capacity_pages"]
    assert m["ninfer_engine_ready"] == 1
    assert m["ninfer_device_kv_capacity_pages"] == 8  # 512 tokens / 64-token pages
    for zero in ("preemptions", "snapshot_restores", "replay_restores", "spec_decode_rounds"):
        assert m[f"ninfer_{zero}_total"] == 0  # features not built yet


def test_the_request_log_has_one_terminal_per_start_and_the_returned_tokens(mix, tokenizer) -> None:
    log = records(mix["log"])  # every line validates against the published schema
    assert log[0]["event"] == "server_start"
    assert {r["server_instance_id"] for r in log} == {log[0]["server_instance_id"]}
    starts = [r["request_id"] for r in log if r["event"] == "request_start"]
    terminals = [r["request_id"] for r in log if r["event"] in TERMINALS]
    assert sorted(starts) == sorted(terminals) and len(set(starts)) == len(starts)
    rejected = {r["request_id"]: r for r in log if r["event"] == "request_rejected"}
    for request_id, status in mix["rejected"]:
        assert rejected[request_id]["status"] == status
        assert rejected[request_id]["phase"] == "prepare"
        assert request_id not in starts  # a preparation rejection never started
    assert rejected[mix["rejected"][0][0]]["code"] == "context_length_exceeded"
    assert rejected[mix["rejected"][1][0]]["code"] == "server_overloaded"
    done = {r["request_id"]: r for r in log if r["event"] == "request_done"}
    for request_id, (text, completion) in mix["returned"].items():
        ids = done[request_id]["result"]["generated_token_ids"]
        assert len(ids) == completion == done[request_id]["usage"]["completion_tokens"]
        assert tokenizer.decode(ids) == text  # the very tokens the client was given
        assert done[request_id]["delivery"] == "delivered" and done[request_id]["status"] == 200
    cancelled = done[mix["cancelled_id"]]
    assert cancelled["finish_reason"] == "cancelled" and cancelled["delivery"] == "client_gone"
    assert cancelled["status"] == 499 and len(cancelled["result"]["generated_token_ids"]) >= 3


def test_server_start_and_no_key_anywhere(mix) -> None:
    log = records(mix["log"])
    start = log[0]
    assert "<redacted>" in start["argv"] and start["server"]["api_key_required"] is True
    assert start["engine"]["max_concurrency"] == 1 and start["capacity"]["max_context"] == 512
    assert start["artifact"]["random_weights"] is True
    assert KEY not in mix["log"].read_text()
    assert not any(KEY in line for line in mix["server"].log)


def test_throughput_records_at_the_interval(mix) -> None:
    records_ = [r for r in records(mix["log"]) if r["event"] == "throughput"]
    assert records_ and all(r["configured_interval_ms"] == 200 for r in records_)
    # ticks sit on absolute deadlines: each interval is one period, give or take scheduling
    assert all(0.1 < r["interval_seconds"] < 1.0 for r in records_)
    assert sum(r["tokens"]["generation"] for r in records_) > 0
    lines = [x for x in mix["server"].log if " INFO throughput " in x]
    assert lines and all("tok/s" in x or "waiting" in x or "running" in x for x in lines)
    assert not any("\x1b" in line for line in mix["server"].log)  # stderr is not a TTY


def test_operational_log_one_line_per_request_without_tracebacks(mix) -> None:
    server = mix["server"]
    for request_id in mix["returned"]:
        line = server.settled(request_id)
        assert " INFO " in line and "status=200 delivery=delivered" in line
        assert "queue=" in line and "prompt=" in line and "completion=" in line
    cancelled = server.settled(mix["cancelled_id"])
    assert "status=499 delivery=client_gone finish=cancelled" in cancelled
    overloaded, too_long = (server.settled(rid) for rid, _ in reversed(mix["rejected"]))
    assert " WARNING " in overloaded and "status=429" in overloaded
    assert " INFO " in too_long and "code=context_length_exceeded" in too_long
    for request_id in [*mix["returned"], mix["cancelled_id"]]:
        assert sum(request_id in line for line in server.log) == 1  # exactly one record
    assert "Traceback" not in "\n".join(server.log)


def test_shutdown_drains_the_stream_in_flight(mix) -> None:
    log = mix["server"].log
    draining = next(x for x in log if "shutdown: draining" in x)
    assert "draining 1 requests in flight" in draining
    drained = next(x for x in log if "shutdown drain:" in x)
    assert "1 settled during drain (completed=1)" in drained and "0 unsettled" in drained
    assert mix["drained_chunks"] > 2  # the client got the rest of its stream


def test_bad_request_log_paths_stop_startup(tmp_path) -> None:
    cases = {  # path -> the reason the one-line message must give
        str(tmp_path / "missing-dir" / "log.jsonl"): "does not exist",
        str(ensure_demo()): "is the model artifact",
        str(tmp_path): "is a directory",
    }
    procs = {  # started together: each pays the CLI's import time
        path: subprocess.Popen(
            [sys.executable, "-m", "ninfer.cli.app", "serve", "--request-log-jsonl", path],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        for path in cases
    }
    for path, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, err
        assert cases[path] in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
