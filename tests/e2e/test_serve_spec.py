"""`ninfer serve --spec mtp` end to end on the demo artifact (random weights, its MTP head).

Greedy chat completions through the real server with speculation on equal those of a server
without it (text and usage, streamed and not), and the request log and /metrics carry the
requests' speculative counters: rounds * k drafted tokens, per-position acceptances summing to
the accepted drafts, and metrics equal to the log's sums.
"""

from __future__ import annotations

import json

import openai
import pytest

from e2e.serve_process import MODEL_ID, serve

pytestmark = pytest.mark.e2e
K = 2
MESSAGES = [[{"role": "user", "content": "Say hello."}]]


def _ask(server) -> list[tuple[str, int]]:  # noqa: ANN001
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    out = []
    for messages in MESSAGES:
        r = client.chat.completions.create(model=MODEL_ID, messages=messages, max_tokens=12)
        out.append((r.choices[0].message.content or "", r.usage.completion_tokens))
        stream = client.chat.completions.create(
            model=MODEL_ID, messages=messages, max_tokens=12, stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        text, usage = "", 0
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
        out.append((text, usage))
    return out


def test_spec_serve_equals_plain_and_logs_its_counters(tmp_path) -> None:
    log = tmp_path / "requests.jsonl"
    with serve("--greedy", "--no-thinking") as plain:
        want = _ask(plain)
    args = ("--greedy", "--no-thinking", "--spec", "mtp", "--draft-tokens", str(K),
            "--request-log-jsonl", str(log))  # fmt: skip
    with serve(*args) as server:
        ready = next(line for line in server.log if "engine ready in" in line)
        assert f"spec=mtp draft_tokens={K}" in ready
        got = _ask(server)
        conn = server.connection()
        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read().decode()
    assert got == want
    done = [
        r for r in map(json.loads, log.read_text().splitlines()) if r["event"] == "request_done"
    ]
    assert len(done) == 2 * len(MESSAGES)
    spec = [r["speculative"] for r in done]
    for s in spec:
        assert s["backend"] == "mtp" and s["draft_window"] == K
        assert s["drafted_tokens"] == K * s["rounds"] and s["rounds"] > 0
        assert sum(s["accepted_per_position"]) == s["accepted_tokens"]
    rounds = sum(s["rounds"] for s in spec)
    line = next(x for x in metrics.splitlines() if x.startswith("ninfer_spec_decode_rounds_total"))
    assert float(line.split()[-1]) == rounds
