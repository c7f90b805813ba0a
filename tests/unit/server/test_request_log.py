"""The JSONL request log: path checks before startup, the envelope, argv redaction, and the
published JSON Schema (which must reject what it does not describe).
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import jsonschema
import pytest

from ninfer.engine.options import EngineOptions
from ninfer.engine.sampling import SamplingPreset
from ninfer.engine.stats import EngineStats
from ninfer.server.config import ServerConfig
from ninfer.server.request_log import (
    SCHEMA_PATH,
    RequestLog,
    RequestLogError,
    check_path,
    redact_argv,
    server_start_body,
)

SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def test_the_schema_is_a_valid_draft_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_path_problems_stop_startup_with_the_reason(tmp_path) -> None:
    with pytest.raises(RequestLogError, match="does not exist"):
        check_path(tmp_path / "missing" / "log.jsonl")
    with pytest.raises(RequestLogError, match="is a directory"):
        check_path(tmp_path)
    artifact = tmp_path / "model.ninfer"
    artifact.write_bytes(b"weights")
    with pytest.raises(RequestLogError, match="is the model artifact"):
        check_path(artifact, artifact)
    link = tmp_path / "link.jsonl"
    os.symlink(artifact, link)
    with pytest.raises(RequestLogError, match="is the model artifact"):
        check_path(link, artifact)  # a path that resolves to the artifact
    assert artifact.read_bytes() == b"weights"  # and it was never opened for writing
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(RequestLogError, match="cannot be opened"):
            check_path(locked / "log.jsonl")


def test_lines_are_appended_flushed_and_enveloped(tmp_path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"earlier": "campaign"}\n')
    first = RequestLog.open(path)
    first.write("request_start", {"request_id": "req-1"})
    # flushed: readable before close, by another reader
    line = json.loads(path.read_text().splitlines()[1])
    assert line["schema"] == "ninfer_serve_request_log" and line["schema_version"] == 1
    assert line["event"] == "request_start" and line["request_id"] == "req-1"
    assert isinstance(line["timestamp_unix_ms"], int) and line["timestamp_unix_ms"] > 1.6e12
    second = RequestLog.open(path)
    second.write("request_start", {"request_id": "req-1"})
    first.close()
    second.close()
    lines = path.read_text().splitlines()
    assert lines[0] == '{"earlier": "campaign"}'  # append mode
    ids = {json.loads(x)["server_instance_id"] for x in lines[1:]}
    assert len(ids) == 2  # one id per server instance


def test_a_disabled_log_writes_nothing() -> None:
    log = RequestLog(None)
    log.write("request_start", {"request_id": "req-1"})
    assert not log.enabled


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["ninfer", "serve", "--api-key", "s3cret", "--port", "1"],
         ["ninfer", "serve", "--api-key", "<redacted>", "--port", "1"]),
        (["ninfer", "serve", "--api-key=s3cret"], ["ninfer", "serve", "--api-key=<redacted>"]),
        (["ninfer", "serve", "--model-id", "x-s3cret-y"], ["ninfer", "serve", "--model-id",
                                                          "x-<redacted>-y"]),
    ],
)  # fmt: skip
def test_argv_never_carries_the_key(argv: list[str], expected: list[str]) -> None:
    assert redact_argv(argv, "s3cret") == expected


def fake_engine() -> SimpleNamespace:
    preset = SamplingPreset(1.0, 0.95, 20, 0.0, 0.0)
    return SimpleNamespace(
        options=EngineOptions(),
        artifact=SimpleNamespace(
            path="/models/demo.ninfer",
            metadata={"name": "demo", "architecture": "qwen3_5", "random_weights": True},
        ),
        model_id="demo",
        presets={"thinking": preset, "non_thinking": preset},
        graph_status="off",
        stats=lambda: EngineStats(kv_capacity_pages=8, state_capacity_slots=2),
    )


def test_server_start_validates_and_redacts(tmp_path) -> None:
    config = ServerConfig(api_key="s3cret")
    log = RequestLog.open(tmp_path / "log.jsonl")
    argv = ("ninfer", "serve", "--api-key", "s3cret")
    log.write("server_start", server_start_body(fake_engine(), config, argv))
    log.close()
    text = (tmp_path / "log.jsonl").read_text()
    assert "s3cret" not in text
    record = json.loads(text)
    VALIDATOR.validate(record)
    assert record["argv"][-1] == "<redacted>" and record["server"]["api_key_required"] is True
    assert record["capacity"]["kv_pages"] == 8
    assert record["sampling_presets"]["thinking"]["top_k"] == 20


def test_the_schema_rejects_what_it_does_not_describe(tmp_path) -> None:
    log = RequestLog.open(tmp_path / "log.jsonl")
    good = log.envelope(
        "request_start",
        {
            "request_id": "req-1", "protocol": "openai_chat", "stream": False, "max_tokens": 5,
            "enable_thinking": True, "thinking_budget": None, "requested_reasoning_effort": None,
            "preserve_thinking": None, "num_messages": 1, "num_tools": 0, "num_stop": 0,
            "sampling_requested": {}, "prompt_tokens": 9, "prepare_seconds": 0.01,
        },
    )  # fmt: skip
    VALIDATOR.validate(good)
    bad = [
        {**good, "prompt_text": "hello"},  # an undeclared field (text must never slip in)
        {k: v for k, v in good.items() if k != "server_instance_id"},
        {**good, "protocol": "grpc"},
        {**good, "event": "request_finished"},
        {**good, "schema_version": 2},
        {**good, "prompt_tokens": -1},
    ]
    for record in bad:
        assert not VALIDATOR.is_valid(record), record
