"""Resource pressure through a live `ninfer serve`: four greedy streams over a KV pool that holds
about two of them pause and resume (host snapshots), every stream still gets the text it gets
alone, and the pressure is visible everywhere the spec puts it: the `/metrics` counters, each
request_done's scheduling object and the request_scheduling records (validated against the
published schema), whose counts agree with each other.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e.serve_process import MODEL_ID, serve
from ninfer.server.request_log import SCHEMA_PATH

pytestmark = pytest.mark.e2e
VALIDATOR = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text()))
STREAMS = 4
MAX_TOKENS = 60


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Stream {i}: tell a story about the number {i}."}]


async def _stream(client: openai.AsyncOpenAI, i: int) -> tuple[str, str, str]:
    stream = await client.chat.completions.create(
        model=MODEL_ID,
        messages=_messages(i),
        max_tokens=MAX_TOKENS,
        stream=True,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    text, finish = [], ""
    async for chunk in stream:
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return stream.response.headers["x-request-id"], "".join(text), finish


def _scrape(base_url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(base_url + "/metrics") as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return out


def test_paused_streams_finish_exactly_and_every_record_counts_the_pauses(tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    # 4 pages of 64 tokens; each stream ends near 80 tokens (2 pages): they cannot all stay
    args = ("--max-concurrency", str(STREAMS), "--kv-capacity", "256", "--greedy",
            "--request-log-jsonl", str(log), "--log-stats-interval-ms", "0")  # fmt: skip
    with serve(*args) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)

        async def main() -> tuple[list[tuple[str, str, str]], tuple[str, str, str]]:
            together = await asyncio.gather(*(_stream(client, i) for i in range(STREAMS)))
            alone = await _stream(client, STREAMS - 1)  # the youngest: paused the most
            return list(together), alone

        together, alone = asyncio.run(main())
        for request_id, _, _ in [*together, alone]:
            server.settled(request_id)
        metrics = _scrape(server.base_url)
    records: list[dict[str, Any]] = [json.loads(x) for x in log.read_text().splitlines()]
    for record in records:
        VALIDATOR.validate(record)
    assert all(finish == "length" for _, _, finish in together)  # never cut short
    assert together[-1][1] == alone[1]  # paused = unpaused, through the server
    done = {r["request_id"]: r for r in records if r["event"] == "request_done"}
    pressure = [done[rid]["scheduling"] for rid, _, _ in together]
    preemptions = sum(s["preemptions"] for s in pressure)
    assert preemptions > 0 and done[alone[0]]["scheduling"]["preemptions"] == 0
    assert metrics["ninfer_preemptions_total"] == preemptions
    restores = sum(s["snapshot_restores"] + s["replay_restores"] for s in pressure)
    assert restores > 0
    assert metrics["ninfer_snapshot_restores_total"] + metrics["ninfer_replay_restores_total"] == (
        restores
    )
    assert metrics["ninfer_replayed_tokens_total"] == sum(s["replayed_tokens"] for s in pressure)
    assert metrics["ninfer_requests_paused"] == 0 == metrics["ninfer_requests_replaying"]
    snapshots = sum(s["snapshot_restores"] for s in pressure)
    if snapshots:  # a request's snapshot bytes went to the host and came back
        moved = sum(s["transfer_bytes"]["state"]["to_host"] for s in pressure)
        assert moved > 0
        assert metrics["ninfer_context_transfer_bytes_total{direction=to_host,resource=state}"] >= (
            moved
        )
    assert any(s["paused_seconds"] > 0 for s in pressure)
    # request_scheduling: every pause cycle of every request, ending at its terminal boundary
    boundaries: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["event"] == "request_scheduling":
            boundaries.setdefault(r["request_id"], []).append(r)
    for rid, record in done.items():
        mine = boundaries.get(rid, [])
        starts = [b for b in mine if b["transition"] == "pause_started"]
        assert len(starts) == record["scheduling"]["preemptions"], rid
        if mine:
            assert mine[-1]["transition"] == "terminal", rid
            assert (
                mine[-1]["progress"]["request"]["replay"]
                == (record["scheduling"]["replayed_tokens"])
            )
