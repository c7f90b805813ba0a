"""The README's quickstart as a new user runs it: its commands are what CI runs, and its curl
requests, sent unchanged (only the port differs) to a live `ninfer serve` on the demo, answer.

The first request turns thinking off, so its small output budget goes to the answer: the stream
must carry content deltas and no reasoning.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.serve_process import ServeProcess, serve

ROOT = Path(__file__).resolve().parents[3]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```bash\n(.*?)```", README, re.DOTALL)
CURL = shutil.which("curl")


def commands(block: str) -> list[str]:
    """The shell commands of a code block: continuations joined (a backslash, or an indented line
    inside a quoted argument), comment lines dropped."""
    text = re.sub(r"\\\n", " ", block)
    parts = re.split(r"\n(?=\S)", text)
    return [p.strip() for p in parts if p.strip() and not p.startswith("#")]


CURLS = [c for block in BLOCKS for c in commands(block) if c.startswith("curl ")]


def test_quickstart_commands_are_what_ci_runs() -> None:
    first, second = commands(BLOCKS[0]), commands(BLOCKS[1])
    assert first == ["python3 -m pip install -q torch==2.13.0 -e . && ninfer serve"]
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line.startswith("py")]
    assert second == ci


@pytest.fixture(scope="module")
def server() -> Iterator[ServeProcess]:
    with serve() as s:
        yield s


def run_curl(command: str, port: int) -> str:
    assert CURL is not None
    argv = shlex.split(command.replace("127.0.0.1:8080", f"127.0.0.1:{port}"))
    done = subprocess.run([CURL, "-sS", *argv[1:]], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (command, done.stdout, done.stderr)
    return done.stdout


NEEDS_CURL = pytest.mark.skipif(CURL is None, reason="curl is not installed")


@pytest.mark.e2e
@NEEDS_CURL
def test_the_first_request_shows_an_answer(server: ServeProcess) -> None:
    first = CURLS[0]
    assert "http://127.0.0.1:8080/v1/chat/completions" in first
    chat = run_curl(first, server.port)
    events = [line[len("data: ") :] for line in chat.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    deltas = [c["delta"] for e in events[:-1] for c in json.loads(e)["choices"]]
    content = "".join(d.get("content") or "" for d in deltas)
    assert content.strip(), chat  # an answer, not only reasoning
    assert not any(d.get("reasoning_content") for d in deltas)
    # redirected stderr holds whole records only: no terminal control sequences
    assert not any("\x1b" in line or "\r" in line for line in server.log)


@pytest.mark.e2e
@NEEDS_CURL
def test_the_responses_and_messages_requests_answer(server: ServeProcess) -> None:
    urls = [re.search(r"http://\S+", c)[0] for c in CURLS[1:]]  # type: ignore[index]
    assert urls == ["http://127.0.0.1:8080/v1/responses", "http://127.0.0.1:8080/v1/messages"]
    responses, messages = (run_curl(c, server.port) for c in CURLS[1:])

    body = json.loads(responses)
    output = body["output"]
    texts = [p["text"] for item in output if item["type"] == "message" for p in item["content"]]
    assert "".join(texts).strip() and not any(i["type"] == "reasoning" for i in output)

    body = json.loads(messages)
    assert [b["type"] for b in body["content"]] == ["text"] and body["content"][0]["text"].strip()
