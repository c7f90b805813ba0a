"""Ordinary mistakes end in one `error:` line naming the problem and exit 2, never a traceback.

Each case runs the real command in a subprocess (stderr is a pipe, as in a script or CI). The
serve and chat cases must fail before any model load: their stderr holds no loading record.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ninfer.artifact.demo import ensure_demo

NINFER = [sys.executable, "-m", "ninfer.cli.app"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NINFER, *args], capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL
    )


def assert_one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], r.stderr
    return lines[0]


@pytest.fixture(scope="module")
def demo() -> Path:
    return ensure_demo()


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("command", ["inspect-artifact", "count-tokens", "serve", "chat"])
def test_an_artifact_path_that_is_a_directory(command: str, tmp_path: Path) -> None:
    extra = ["--text", "hi"] if command == "count-tokens" else []
    r = run(command, str(tmp_path), *extra)
    assert_one_line_error(r, str(tmp_path), "is a directory")


def test_count_tokens_messages_naming_a_directory(tmp_path: Path, demo: Path) -> None:
    r = run("count-tokens", str(demo), "--messages", str(tmp_path))
    assert_one_line_error(r, str(tmp_path), "messages file is a directory")


@pytest.mark.parametrize("command", ["count-tokens", "serve", "chat"])
def test_a_missing_chat_template_file(command: str, tmp_path: Path, demo: Path) -> None:
    missing = tmp_path / "nope.jinja"
    extra = ["--text", "hi"] if command == "count-tokens" else []
    r = run(command, str(demo), *extra, "--chat-template", str(missing))
    assert_one_line_error(r, str(missing), "chat template not found")


def test_a_chat_template_with_a_syntax_error_fails_before_loading(
    tmp_path: Path, demo: Path
) -> None:
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }")
    r = run("serve", str(demo), "--chat-template", str(bad), "--port", "0")
    assert_one_line_error(r)
    assert "loading" not in r.stderr


def test_serve_checks_a_busy_port_before_loading_the_model(demo: Path, busy_port: int) -> None:
    r = run("serve", str(demo), "--port", str(busy_port))
    line = assert_one_line_error(r, f"127.0.0.1:{busy_port}", "already in use")
    assert "loading" not in line


def test_serve_checks_the_host_before_loading_the_model(demo: Path) -> None:
    # .invalid never resolves (RFC 2606)
    r = run("serve", str(demo), "--host", "no-such-host.invalid", "--port", "0")
    assert_one_line_error(r, "--host no-such-host.invalid", "cannot resolve")


def test_convert_a_truncated_safetensors_file(tiny_checkpoint: Path, tmp_path: Path) -> None:
    shard = next(tiny_checkpoint.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    out = tmp_path / "out.ninfer"
    r = run("convert", str(tiny_checkpoint), str(out))
    assert_one_line_error(r, str(shard), "safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no OUT, no partial file


def test_convert_to_an_unwritable_destination(tiny_checkpoint: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    out = blocker / "out.ninfer"
    r = run("convert", str(tiny_checkpoint), str(out))
    assert_one_line_error(r, str(out))
    assert blocker.read_text() == "not a directory"


def test_convert_a_missing_checkpoint_directory(tmp_path: Path) -> None:
    r = run("convert", str(tmp_path / "nowhere"), str(tmp_path / "out.ninfer"))
    assert_one_line_error(r, str(tmp_path / "nowhere"), "no such checkpoint directory")


def test_convert_refuses_an_existing_output_without_force(
    tiny_checkpoint: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.ninfer"
    out.write_bytes(b"precious")
    r = run("convert", str(tiny_checkpoint), str(out))
    assert_one_line_error(r, str(out), "already exists", "--force")
    assert out.read_bytes() == b"precious"


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["chat", "--temperature", "nan"], ["--temperature"]),
        (["chat", "--device", "gpu0"], ["--device 'gpu0'", "auto, cpu, cuda, cuda:N or N"]),
        (["serve", "--device", "gpu0"], ["--device 'gpu0'", "auto, cpu, cuda, cuda:N or N"]),
        (["bench", "--synthetic", "tiny-dense", "--device", "gpu0"], ["--device 'gpu0'"]),
        (["serve", "--kv-dtype", "fp9"], ["--kv-dtype must be one of", "fp9"]),
        (["serve", "--max-model-len", "300", "--max-context", "400"], ["conflicts"]),
        (["serve", "--no-such-flag"], ["No such option: --no-such-flag", "ninfer serve -h"]),
    ],
)
def test_bad_flags_fail_before_loading(args: list[str], needles: list[str], demo: Path) -> None:
    r = run(*args)
    assert_one_line_error(r, *needles)
    assert "loading" not in r.stderr


@pytest.fixture
def tiny_checkpoint(tmp_path: Path) -> Path:
    from ninfer.testing import TinySpec, make_tiny_checkpoint

    return make_tiny_checkpoint(
        tmp_path / "hf", TinySpec(kind="dense", vocab_size=512, with_vision=False), seed=0
    )
