"""The `ninfer` command as a user meets it: subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ninfer.artifact.demo import demo_path, ensure_demo
from ninfer.artifact.reader import Artifact
from ninfer.chat.template import ChatTemplate
from ninfer.tokenizer import Tokenizer
from support.artifact_files import rewrite_header, write_artifact

NINFER = [sys.executable, "-m", "ninfer.cli.app"]
DESIGN_CARD = ("serve", "chat", "count-tokens", "bench", "inspect-artifact", "convert")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*NINFER, *args], capture_output=True, text=True, timeout=300)


def assert_one_line_error(r: subprocess.CompletedProcess[str], needle: str) -> None:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr


@pytest.fixture(scope="module")
def demo() -> Path:
    return ensure_demo()


def test_help_lists_every_design_card_command() -> None:
    r = run("--help")
    assert r.returncode == 0
    for name in DESIGN_CARD:
        assert name in r.stdout


def test_inspect_demo_says_random_weights(demo: Path) -> None:
    r = run("inspect-artifact")
    assert r.returncode == 0, r.stderr
    assert "RANDOM WEIGHTS" in r.stdout and str(demo_path()) in r.stdout
    info = json.loads(run("inspect-artifact", str(demo), "--json", "--verify").stdout)
    assert info["metadata"]["random_weights"] is True
    assert "random" in info["metadata"]["name"]
    assert info["components"] == ["text", "mtp", "vision"]
    assert info["config"]["vocab_size"] == 248320
    assert sum(t["count"] for t in info["tensors"]) == info["num_tensors"]


def test_count_tokens_matches_the_template_path(demo: Path, tmp_path: Path) -> None:
    messages = [
        {"role": "system", "content": "Be brief. <|im_end|> is just text here."},
        {"role": "user", "content": "What is <tool_call>?"},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    (tmp_path / "m.json").write_text(json.dumps({"messages": messages}))
    (tmp_path / "t.json").write_text(json.dumps(tools))
    r = run(
        "count-tokens",
        str(demo),
        "--messages",
        str(tmp_path / "m.json"),
        "--tools",
        str(tmp_path / "t.json"),
        "--show",
    )
    assert r.returncode == 0, r.stderr
    with Artifact(demo) as art:
        template, tok = ChatTemplate(art.chat_template()), Tokenizer.from_json(art.tokenizer_json)
    ids = template.render_ids(tok, messages, tools=tools)
    assert r.stdout.strip().splitlines()[-1] == str(len(ids))
    assert template.render(messages, tools=tools) in r.stdout
    # the quoted control tokens stayed text: exactly the template's own special ids remain
    specials = set(tok.special_tokens.values())
    assert [i for i in ids if i in specials].count(tok.token_to_id("<|im_end|>")) == 2
    # the tools preamble's own <tool_call> markers are special; the user's quoted one is not
    plain = [messages[0], {"role": "user", "content": "What is it?"}]
    tool_call = tok.token_to_id("<tool_call>")
    assert ids.count(tool_call) == template.render_ids(tok, plain, tools=tools).count(tool_call)
    no_think = run("count-tokens", str(demo), "--text", "hi", "--no-thinking")
    think = run("count-tokens", str(demo), "--text", "hi")
    assert int(no_think.stdout) > int(think.stdout)  # the empty think block is pre-filled


def _png_url(width: int, height: int) -> str:
    import base64
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (width, height), (20, 160, 90)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_count_tokens_expands_images_as_the_engine_does(demo: Path, tmp_path: Path) -> None:
    # An image is as many prompt tokens as its size makes vision tokens, not one placeholder:
    # the count must equal a vision engine's own count of the same conversation.
    from ninfer import Engine

    def image(w: int, h: int) -> dict:
        return {"type": "image_url", "image_url": {"url": _png_url(w, h)}}

    messages = [
        {"role": "user", "content": [image(200, 120), {"type": "text", "text": "and"},
                                     image(64, 300), {"type": "text", "text": "What are these?"}]},
    ]  # fmt: skip
    (tmp_path / "m.json").write_text(json.dumps(messages))
    r = run("count-tokens", str(demo), "--messages", str(tmp_path / "m.json"))
    assert r.returncode == 0, r.stderr
    engine = Engine.load(demo, vision=True)
    try:
        expected = engine.count_prompt_tokens(messages)
        text_only = len(engine.render(messages))
    finally:
        engine.close()
    assert int(r.stdout) == expected > text_only + 10
    messages[0]["content"][0]["image_url"]["url"] = "data:image/png;base64,xx"
    (tmp_path / "bad.json").write_text(json.dumps(messages))
    bad = run("count-tokens", str(demo), "--messages", str(tmp_path / "bad.json"))
    assert_one_line_error(bad, "messages[0].content[0]: data URI has invalid base64")


def test_count_tokens_of_media_needs_a_vision_tower() -> None:
    from types import SimpleNamespace

    from ninfer.cli.count_tokens_cmd import _expand_media
    from ninfer.cli.errors import UserError

    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(UserError, match=r"messages\[0\]\.content\[0\]: .*no vision tower"):
        _expand_media(SimpleNamespace(components=["text"]), None, [1, 2], msgs)
    assert _expand_media(SimpleNamespace(components=["text"]), None, [1, 2], []) == [1, 2]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["count-tokens", "--text", "a", "--messages", "x.json"], "exactly one of"),
        (["count-tokens", "--messages", "missing.json"], "not found"),
        (["inspect-artifact", "no/such/file.ninfer"], "no such artifact file"),
        (["convert", "no/such/dir", "out.ninfer"], "no such checkpoint directory"),
    ],
)
def test_usage_errors_are_one_line(args: list[str], needle: str, demo: Path) -> None:
    assert_one_line_error(run(*args), needle)


CORRUPTIONS = {
    "magic": (lambda p: p.write_bytes(b"XXXX" + p.read_bytes()[4:]), "wrong magic"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:-512]), "truncated"),
    "format": (
        lambda p: rewrite_header(
            p, lambda d: d["tensors"]["text.norm.weight"].__setitem__("format", "int3")
        ),
        "unknown weight format",
    ),
    "shape": (
        lambda p: rewrite_header(p, lambda d: d["config"]["text"].__setitem__("hidden_size", 40)),
        "has shape",
    ),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_corrupt_artifacts_fail_cleanly_in_the_cli(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.ninfer"
    write_artifact(path)
    corrupt, needle = CORRUPTIONS[kind]
    corrupt(path)
    assert_one_line_error(run("inspect-artifact", str(path)), needle)
