"""Progress on stderr: a live bar on a terminal, a few plain lines (no control sequences) otherwise.

StepProgress is driven with a fake clock; the real commands run as subprocesses with stderr on a
pipe (plain lines) and on a pseudo-terminal (the bar).
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from ninfer.cli.progress import StepProgress

NINFER = [sys.executable, "-m", "ninfer.cli.app"]
CONTROL = ("\x1b", "\r")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def plain(clock: Clock, lines: list[str], **kw: object) -> StepProgress:
    from ninfer.cli.progress import StepProgress

    return StepProgress("copying", interactive=False, emit=lines.append, clock=clock, **kw)


def test_plain_lines_start_at_the_first_report_and_are_throttled() -> None:
    clock, lines = Clock(), []
    with plain(clock, lines, unit="bytes", interval_s=5.0) as bar:
        assert lines == []  # a step that fails while checking its input prints nothing
        bar.update(0, 4 << 30)
        assert lines == ["copying ..."]
        clock.now += 1
        bar.update(1 << 30, 4 << 30)  # within the interval: no line
        clock.now += 5
        bar.update(2 << 30, 4 << 30)
        clock.now += 1
        bar.phase("binding")
        clock.now += 1.5
    assert lines == [
        "copying ...",
        "copying: 2.0 GiB of 4.0 GiB (50%)",
        "binding ...",
        "binding: done in 8.5s",
    ]


def test_a_failed_step_adds_no_line() -> None:
    clock, lines = Clock(), []
    with pytest.raises(RuntimeError), plain(clock, lines, unit="tensors") as bar:
        bar.update(3, 10)
        raise RuntimeError("boom")
    assert lines == ["copying ..."]


def test_done_takes_a_summary_once() -> None:
    clock, lines = Clock(), []
    with plain(clock, lines, unit="tensors") as bar:
        bar.update(1, 2, "a")
        bar.done("copied 2 tensors")
        bar.update(2, 2, "b")  # after done: ignored
    assert lines == ["copying ...", "copied 2 tensors"]


def _run_piped(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NINFER, *args],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def tiny_checkpoint(tmp_path: Path) -> Path:
    from ninfer.testing import TinySpec, make_tiny_checkpoint

    return make_tiny_checkpoint(
        tmp_path / "hf", TinySpec(kind="dense", vocab_size=512, with_vision=False), seed=0
    )


def test_convert_progress_on_a_pipe_is_plain_lines(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.ninfer"
    r = _run_piped("convert", str(tiny_checkpoint), str(out))
    assert r.returncode == 0, r.stderr
    assert not any(c in r.stderr for c in CONTROL), repr(r.stderr)
    lines = r.stderr.splitlines()
    assert lines[0] == "converting hf ..."
    assert lines[-1].startswith(f"wrote {out} (") and "tensors" in lines[-1]


def test_convert_progress_on_a_terminal_is_a_live_bar(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.ninfer"
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [*NINFER, "convert", str(tiny_checkpoint), str(out)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=follower,
        env=env,
    )
    os.close(follower)
    seen = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 300)
        if not ready:
            proc.kill()
            raise AssertionError(f"no output for 300 s: {seen!r}")
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=60) == 0, seen
    text = seen.decode(errors="replace")
    assert "\x1b[" in text  # the bar drew and erased itself
    assert "converting hf" in text and "tensors" in text
    assert f"wrote {out}" in text


def test_demo_build_and_model_load_report_progress(tmp_path: Path) -> None:
    demo = tmp_path / "demo.ninfer"
    r = _run_piped("chat", "--device", "cpu", env={"NINFER_DEMO": str(demo)})
    assert r.returncode == 0, r.stderr
    assert not any(c in r.stderr for c in CONTROL), repr(r.stderr)
    lines = r.stderr.splitlines()
    assert lines[0] == f"building the demo artifact (tiny model, RANDOM weights) at {demo} ..."
    assert lines[1].startswith(f"built the demo artifact {demo} in ")
    assert lines[2:4] == ["loading the model ...", "placing the weights on cpu ..."]
    assert len(lines) == 5 and lines[4].startswith("loaded ninfer-demo-random in ")
    assert demo.is_file()


@pytest.mark.gpu
def test_each_cuda_graph_capture_is_reported() -> None:
    """The callback `serve` logs through: one report per captured decode graph, on first use."""
    from ninfer.api import Engine
    from ninfer.artifact.demo import ensure_demo
    from ninfer.artifact.reader import Artifact
    from ninfer.engine.options import EngineOptions

    captures: list[tuple[int, int, float]] = []
    options = EngineOptions(device="cuda:0", max_context=256)
    report = lambda rows, wide, s: captures.append((rows, wide, s))  # noqa: E731
    with Engine.from_artifact(Artifact(ensure_demo()), options, on_graph_capture=report) as engine:
        if engine.graph_status != "on":
            pytest.skip(f"CUDA graphs are {engine.graph_status}")
        list(engine.generate([1, 2, 3], max_tokens=4, ignore_eos=True))
        first = list(captures)
        list(engine.generate([1, 2, 3], max_tokens=4, ignore_eos=True))
    assert first and all(rows == 1 and wide >= 1 and s > 0 for rows, wide, s in first)
    assert captures == first  # the same shape again replays: nothing new is captured
