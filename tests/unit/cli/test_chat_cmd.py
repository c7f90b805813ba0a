"""`ninfer chat`: input reading, commands and history in-process, then the real REPL in tmux.

The in-process tests drive `repl` with a scripted reader and a fake engine, so the expected
messages are known independently. The e2e tests run `python -m ninfer.cli.app chat` on the demo
artifact inside a private tmux server and assert on structure (prompts, stats lines, token counts
computed from the artifact's own template), never on the random model's text.
"""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from ninfer.api import ChatEvent, ChatUsage
from ninfer.cli.chat_cmd import (
    ChatCommandError,
    ChatSession,
    Command,
    CommandKind,
    parse_command,
    read_message,
    repl,
    stats_line,
)
from ninfer.engine.errors import ContextLengthExceeded
from ninfer.engine.request import FinishReason, RequestStats, Timings
from ninfer.media.errors import MediaError
from support.media_files import encode_image, noise_image


def _reader(lines: list[str]) -> Callable[[str], str]:
    """An input() stand-in: returns the lines in order, then EOF; records the prompts shown."""
    pending = list(lines)

    def read(prompt: str) -> str:
        read.prompts.append(prompt)  # type: ignore[attr-defined]
        if not pending:
            raise EOFError
        item = pending.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item

    read.prompts = []  # type: ignore[attr-defined]
    return read


# -- input --------------------------------------------------------------------------------------
def test_single_line() -> None:
    assert read_message(_reader(["hello there"])) == "hello there"


def test_backslash_continues_the_line() -> None:
    read = _reader(["first \\", "second\\", "third", "not read"])
    assert read_message(read) == "first \nsecond\nthird"
    assert read.prompts == [">>> ", "... ", "... "]  # type: ignore[attr-defined]


def test_triple_quote_block_keeps_lines_verbatim() -> None:
    read = _reader(['"""def f():', "    return 1 \\", "", 'end"""', "not read"])
    assert read_message(read) == "def f():\n    return 1 \\\n\nend"


def test_triple_quote_block_with_bare_fences() -> None:
    assert read_message(_reader(['"""', "a", "b", '"""'])) == "a\nb"
    assert read_message(_reader(['"""one line"""'])) == "one line"


def test_eof_and_interrupt_pass_through() -> None:
    with pytest.raises(EOFError):
        read_message(_reader([]))
    with pytest.raises(EOFError):
        read_message(_reader(["open \\"]))
    with pytest.raises(KeyboardInterrupt):
        read_message(_reader([KeyboardInterrupt()]))  # type: ignore[list-item]


# -- commands and session ---------------------------------------------------------------------
def test_parse_commands() -> None:
    assert parse_command("hello /reset") is None
    assert parse_command("/reset") == Command(CommandKind.RESET)
    assert parse_command("/think OFF") == Command(CommandKind.THINK, "OFF")
    assert parse_command("/system  You are terse. ") == Command(
        CommandKind.SYSTEM, "You are terse."
    )
    assert parse_command("/exit") == Command(CommandKind.EXIT)
    assert parse_command("/quit") == Command(CommandKind.EXIT)
    with pytest.raises(ChatCommandError, match="unknown command /frobnicate"):
        parse_command("/frobnicate")
    with pytest.raises(ChatCommandError, match="/think on\\|off"):
        parse_command("/think maybe")


def test_session_messages_and_commands() -> None:
    s = ChatSession()
    s.record("q1", "a1", "r1")
    s.record("q2", "a2", "")
    s.apply(Command(CommandKind.SYSTEM, "be brief"))
    assert s.messages("q3") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "r1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "q3"},
    ]
    s.apply(Command(CommandKind.THINK, "off"))
    assert not s.enable_thinking
    s.apply(Command(CommandKind.RESET))
    s.apply(Command(CommandKind.SYSTEM, ""))
    assert s.messages("q") == [{"role": "user", "content": "q"}]


def test_stats_line_reports_decode_speed() -> None:
    # 11 tokens over 500 ms: 10 inter-token steps, so 20 tokens/s (llama.cpp's definition)
    event = ChatEvent(
        "finished",
        finish_reason=FinishReason.LENGTH,
        usage=ChatUsage(prompt_tokens=5, completion_tokens=11, reasoning_tokens=4),
        timings=Timings(cache_n=0, prompt_n=5, prompt_ms=9.0, predicted_n=11, predicted_ms=500.0),
    )
    assert stats_line(event) == "5 prompt · 11 tokens (4 reasoning) · 20.0 tok/s · length"


def test_stats_line_reports_tokens_per_round_under_speculation() -> None:
    # 4 rounds committing 4 + 5 accepted drafts: 2.25 tokens a round, 5 of 12 drafts accepted
    stats = RequestStats(
        t_submitted=0.0,
        speculative={"rounds": 4, "drafted_tokens": 12, "accepted_tokens": 5},
    )
    event = ChatEvent(
        "finished",
        finish_reason=FinishReason.STOP,
        usage=ChatUsage(prompt_tokens=5, completion_tokens=10, reasoning_tokens=0),
        stats=stats,
    )
    assert stats_line(event).endswith("· 2.25 tokens/round (5/12 drafts accepted) · stop")
    plain = RequestStats(t_submitted=0.0, speculative={"rounds": 0, "accepted_tokens": 0})
    assert "round" not in stats_line(ChatEvent("finished", stats=plain))


# -- the loop against a fake engine -------------------------------------------------------------
FINISHED = ChatEvent(
    "finished",
    finish_reason=FinishReason.STOP,
    usage=ChatUsage(3, 2, reasoning_tokens=1),
    timings=Timings(0, 3, 1.0, 2, 100.0),
)


class FakeEngine:
    """Answers each turn from a script; records what each call was given."""

    def __init__(self, turns: list[Callable[[], Iterator[ChatEvent]]]) -> None:
        self.turns = list(turns)
        self.calls: list[dict[str, Any]] = []
        self.closed: list[int] = []

    def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> Iterator[ChatEvent]:
        self.calls.append(
            {"messages": [dict(m) for m in messages], "closed": len(self.closed), **kwargs}
        )
        return self.turns.pop(0)()


def _answer(reasoning: str, content: str) -> Callable[[], Iterator[ChatEvent]]:
    def gen() -> Iterator[ChatEvent]:
        yield ChatEvent("reasoning", text=reasoning)
        yield ChatEvent("content", text=content)
        yield FINISHED

    return gen


class InterruptingConsole(Console):
    """Ctrl-C arrives while the REPL prints the text "BOOM" (i.e. outside the iterator)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if objects and objects[0] == "BOOM":
            raise KeyboardInterrupt
        super().print(*objects, **kwargs)


def _run(engine: FakeEngine, lines: list[Any], thinking: bool = True) -> tuple[str, ChatSession]:
    out = io.StringIO()
    session = ChatSession(enable_thinking=thinking)
    console = InterruptingConsole(file=out, width=200, highlight=False)
    repl(engine, console, session, max_tokens=7, read=_reader(lines))  # type: ignore[arg-type]
    return out.getvalue(), session


def test_turns_accumulate_history_with_reasoning() -> None:
    engine = FakeEngine([_answer("hmm", "four"), _answer("ok", "five")])
    out, _ = _run(engine, ["2+2?", "/think off", "and 2+3?", "/exit", "never read"])
    first, second = engine.calls
    assert first["messages"] == [{"role": "user", "content": "2+2?"}]
    assert first["enable_thinking"] is True and first["max_tokens"] == 7
    assert second["enable_thinking"] is False
    assert second["messages"] == [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "four", "reasoning_content": "hmm"},
        {"role": "user", "content": "and 2+3?"},
    ]
    assert out.count("tok/s") == 2 and "thinking off" in out


def test_interrupt_closes_the_stream_and_drops_the_turn() -> None:
    def interrupted() -> Iterator[ChatEvent]:
        try:
            yield ChatEvent("reasoning", text="thinking...")
            yield ChatEvent("content", text="BOOM")
            yield FINISHED
        finally:
            engine.closed.append(1)

    engine = FakeEngine([interrupted, _answer("r", "fine")])
    out, session = _run(engine, ["long question", "next question"])
    # the interrupted stream was closed (which cancels the request) before the next turn began
    assert engine.calls[1]["closed"] == 1
    assert engine.calls[1]["messages"] == [{"role": "user", "content": "next question"}]
    assert "[stopped" in out and out.count("tok/s") == 1
    assert len(session.history) == 2


def test_engine_errors_keep_the_session() -> None:
    def too_long() -> Iterator[ChatEvent]:
        raise ContextLengthExceeded(9000, 8192)
        yield  # pragma: no cover

    engine = FakeEngine([too_long, _answer("", "short")])
    out, session = _run(engine, ["x" * 10, "y"])
    assert "error: the prompt has 9000 tokens" in out
    assert engine.calls[1]["messages"] == [{"role": "user", "content": "y"}]
    assert session.history[-1] == {"role": "assistant", "content": "short"}


def test_interrupt_at_the_prompt_exits() -> None:
    engine = FakeEngine([])
    _run(engine, [KeyboardInterrupt()])
    _run(engine, [])  # Ctrl-D
    assert engine.calls == []


# -- e2e: the real command in tmux --------------------------------------------------------------
TMUX = shutil.which("tmux")
STATS = re.compile(r"^(\d+) prompt . (\d+) tokens \((\d+) reasoning\) . (\S+) tok/s . (\w+)\s*$")
PROMPT = re.compile(r"^>>>( |$)")
NEEDS_TMUX = pytest.mark.skipif(TMUX is None, reason="tmux is not installed")


# Runs the command as a child and prints its exit status: tmux 3.3 does not always reap a dead
# pane's process, so `#{pane_dead_status}` can stay empty. Ctrl-C reaches both; the wrapper waits.
WRAPPER = """
import subprocess, sys
child = subprocess.Popen(sys.argv[1:])
while True:
    try:
        status = child.wait()
        break
    except KeyboardInterrupt:
        pass
print(f"[exit status {status}]", flush=True)
"""
EXIT = re.compile(r"^\[exit status (-?\d+)\]", re.MULTILINE)


class Pane:
    """`ninfer chat` in a private tmux server; polls the screen with a deadline."""

    def __init__(self, tmp: Path, args: list[str]) -> None:
        assert TMUX is not None
        conf = tmp / "tmux.conf"
        conf.write_text("set-option -g remain-on-exit on\nset-option -g history-limit 5000\n")
        self.base = [TMUX, "-u", "-f", str(conf), "-S", str(tmp / "tmux.sock")]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "NO_COLOR": "1"}
        command = [sys.executable, "-c", WRAPPER, sys.executable, "-m", "ninfer.cli.app", "chat"]
        size = ["-x", "200", "-y", "50"]
        self._tmux("new-session", "-d", "-s", "chat", *size, "--", *command, *args, env=env)

    def _tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(
            [*self.base, *args], capture_output=True, text=True, check=True, env=env
        )
        return done.stdout

    def send(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "chat", *keys)

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-J", "-S", "-", "-t", "chat")

    def wait(self, what: str, ok: Callable[[str], bool], timeout: float = 45.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if ok(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; screen:\n{screen}")
            time.sleep(0.05)

    def wait_prompts(self, n: int) -> str:
        return self.wait(f"{n} prompts", lambda s: _num_prompts(s) >= n)

    def exit_status(self) -> int:
        match = EXIT.search(self.wait("the exit status", lambda s: EXIT.search(s) is not None, 20))
        assert match is not None
        return int(match[1])

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True)


def _num_prompts(screen: str) -> int:
    return sum(1 for line in screen.splitlines() if PROMPT.match(line))


def _stats(screen: str) -> list[tuple[int, int, int, str]]:
    found = (STATS.match(line) for line in screen.splitlines())
    return [(int(m[1]), int(m[2]), int(m[3]), m[5]) for m in found if m]


@pytest.fixture(scope="module")
def demo() -> Path:
    from ninfer.artifact.demo import ensure_demo

    return ensure_demo()


@pytest.fixture
def pane(tmp_path: Path, demo: Path, request: pytest.FixtureRequest) -> Iterator[Pane]:
    p = Pane(tmp_path, [str(demo), "--greedy", *request.param])
    yield p
    p.close()


def _prompt_tokens(demo: Path, messages: list[dict[str, str]], **kwargs: Any) -> int:
    """The prompt size the engine should see, from the artifact's own template and tokenizer."""
    from ninfer.artifact.reader import Artifact
    from ninfer.chat.template import ChatTemplate
    from ninfer.tokenizer import Tokenizer

    with Artifact(demo) as art:
        template, tokenizer = (
            ChatTemplate(art.chat_template()),
            Tokenizer.from_json(art.tokenizer_json),
        )
    return len(template.render_ids(tokenizer, messages, **kwargs))


@pytest.mark.parametrize("pane", [["--max-tokens", "8"]], indirect=True)
@pytest.mark.e2e
@NEEDS_TMUX
def test_chat_answers_resets_toggles_thinking_and_exits(pane: Pane, demo: Path) -> None:
    screen = pane.wait_prompts(1)
    assert "RANDOM WEIGHTS" in screen
    one_turn = _prompt_tokens(demo, [{"role": "user", "content": "hello"}])

    pane.send("hello", "Enter")
    first = _stats(pane.wait_prompts(2))
    assert len(first) == 1
    prompt, tokens, reasoning, finish = first[0]
    assert (prompt, tokens, finish) == (one_turn, 8, "length")
    assert reasoning > 0  # thinking is on: the answer opens in the reasoning channel

    pane.send("hello", "Enter")
    second = _stats(pane.wait_prompts(3))[-1]
    assert second[0] > one_turn  # the first exchange is in the history

    pane.send("/reset", "Enter")
    assert "history cleared" in pane.wait_prompts(4)
    pane.send("hello", "Enter")
    assert _stats(pane.wait_prompts(5))[-1] == first[0]  # same prompt, greedy: same answer

    pane.send("/think off", "Enter")
    pane.wait_prompts(6)
    pane.send("hello", "Enter")
    no_think = _stats(pane.wait_prompts(7))[-1]
    off_prompt = _prompt_tokens(demo, [{"role": "user", "content": "hello"}], enable_thinking=False)
    assert off_prompt != one_turn
    assert no_think[0] > off_prompt  # the history survives /think
    assert no_think[2] == 0

    pane.send("/exit", "Enter")
    assert pane.exit_status() == 0


@pytest.mark.parametrize(
    "pane", [["--max-tokens", "100000", "--max-context", "128"]], indirect=True
)
@pytest.mark.e2e
@NEEDS_TMUX
def test_ctrl_c_stops_an_answer_and_keeps_the_session(pane: Pane, demo: Path) -> None:
    pane.wait_prompts(1)
    pane.send("hello", "Enter")

    def streaming(screen: str) -> bool:
        lines = screen.splitlines()
        asked = [i for i, line in enumerate(lines) if line.startswith(">>> hello")]
        return bool(asked) and any(line.strip() for line in lines[asked[0] + 1 :])

    pane.wait("the answer to stream", streaming)
    pane.send("C-c")
    screen = pane.wait_prompts(2)
    assert "[stopped" in screen and not _stats(screen)

    # the stopped turn left no history and freed the engine: the next answer runs to max_context
    pane.send("hello", "Enter")
    stats = _stats(pane.wait_prompts(3))
    one_turn = _prompt_tokens(demo, [{"role": "user", "content": "hello"}])
    assert stats == [(one_turn, 128 - one_turn, stats[0][2], "context")]

    pane.send("C-c")  # at the prompt: a clean exit
    assert pane.exit_status() == 0


# -- /image -------------------------------------------------------------------------------------


def test_image_command_attaches_to_the_next_message_and_stays_in_history(tmp_path: Path) -> None:
    png = tmp_path / "shot.png"
    png.write_bytes(encode_image(noise_image(8, 8)))
    engine = FakeEngine([_answer("", "a cat"), _answer("", "still a cat")])
    out, session = _run(engine, [f"/image {png}", "what is it?", "sure?", "/exit"])
    uri = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()
    image_turn = [{"type": "image", "image": uri}, {"type": "text", "text": "what is it?"}]
    assert engine.calls[0]["messages"] == [{"role": "user", "content": image_turn}]
    assert engine.calls[1]["messages"][0] == {"role": "user", "content": image_turn}
    assert engine.calls[1]["messages"][2] == {"role": "user", "content": "sure?"}
    assert "image attached" in out and not session.images


def test_image_command_errors_keep_the_session(tmp_path: Path) -> None:
    def refused() -> Iterator[ChatEvent]:
        raise MediaError("image input needs vision", code="vision_disabled")
        yield  # pragma: no cover

    png = tmp_path / "a.png"
    png.write_bytes(encode_image(noise_image(8, 8)))
    (tmp_path / "notes.txt").write_text("not an image")
    engine = FakeEngine([refused, _answer("", "ok")])
    out, session = _run(engine, ["/image", f"/image {tmp_path / 'missing.png'}",
                                 f"/image {tmp_path / 'notes.txt'}", f"/image {png}",
                                 "look", "plain"])  # fmt: skip
    assert "usage: /image PATH" in out and "cannot read" in out
    assert "notes.txt: cannot decode image bytes: not an image format" in out  # at /image
    assert out.count("image attached") == 1
    assert "start ninfer chat with --vision" in out
    assert engine.calls[1]["messages"] == [{"role": "user", "content": "plain"}]
    assert len(session.history) == 2


def test_image_command_without_vision_is_refused_at_once(tmp_path: Path) -> None:
    png = tmp_path / "a.png"
    png.write_bytes(encode_image(noise_image(8, 8)))
    engine = FakeEngine([_answer("", "ok")])
    out = io.StringIO()
    session = ChatSession(enable_thinking=False, vision=False)
    repl(engine, Console(file=out, width=200), session, max_tokens=3,  # type: ignore[arg-type]
         read=_reader([f"/image {png}", "hello", "/exit"]))  # fmt: skip
    assert "/image needs the vision tower: start ninfer chat with --vision" in out.getvalue()
    assert engine.calls[0]["messages"] == [{"role": "user", "content": "hello"}]


def test_image_turn_on_a_real_vision_engine(tmp_path: Path) -> None:
    from ninfer import Engine
    from ninfer.artifact.convert import convert
    from ninfer.testing import TinySpec, make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(tmp_path / "hf", TinySpec(with_mtp=False), seed=2)
    art = convert(ckpt, tmp_path / "v.ninfer").path
    png = tmp_path / "p.png"
    png.write_bytes(encode_image(noise_image(64, 64)))
    with Engine.load(art, dtype="fp32", vision=True, max_context=512, greedy=True) as engine:
        out = io.StringIO()
        session = ChatSession(enable_thinking=False)
        repl(engine, Console(file=out, width=200), session, max_tokens=3,
             read=_reader([f"/image {png}", "describe", "/exit"]))  # fmt: skip
        assert "tok/s" in out.getvalue()
        assert session.history[0]["content"][0]["type"] == "image"


def test_spec_turns_on_a_real_engine_answer_as_plain_decoding_does() -> None:
    # `ninfer chat --spec mtp`: the demo's MTP head drafts, the target verifies; greedy answers
    # (reasoning and content) equal the plain engine's, and the stats line reports the rounds.
    from ninfer import Engine
    from ninfer.artifact.demo import ensure_demo

    def converse(**spec: Any) -> tuple[str, ChatSession]:
        with Engine.load(ensure_demo(), dtype="fp32", max_context=512, greedy=True, **spec) as e:
            out = io.StringIO()
            session = ChatSession()
            repl(e, Console(file=out, width=200), session, max_tokens=12,
                 read=_reader(["hello", "and again", "/exit"]))  # fmt: skip
            return out.getvalue(), session

    spec_out, spec_session = converse(spec="mtp", draft_tokens=2)
    plain_out, plain_session = converse()
    assert spec_session.history == plain_session.history and len(spec_session.history) == 4
    assert spec_out.count("tokens/round") == 2 and "tokens/round" not in plain_out
