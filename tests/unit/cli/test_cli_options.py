"""The command line as parsed: help text, --version, aliases, one --device form, checks that run
before a model loads, refused unbuilt options, inspect --json --verify, convert --force.

In-process through typer's CliRunner; the server and model load are replaced by recorders where a
test only needs to see what the command would hand over.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

import ninfer
from ninfer.artifact.demo import ensure_demo
from ninfer.cli.app import app
from ninfer.cli.errors import UserError

COMMANDS = ("serve", "chat", "count-tokens", "inspect-artifact", "convert", "bench")
# every serve option the spec names that this version refuses (with a sample value)
UNBUILT = {
    "--spec": ["dflash"],
    "--context-cost-presets": ["presets.json"],
}
TYPE_NOISE = re.compile(r"<(bool|int|float|str|text|path|integer)[^>]*>", re.IGNORECASE)


def invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


@pytest.fixture(scope="module")
def demo() -> Path:
    return ensure_demo()


# -- help and version ---------------------------------------------------------------------------
@pytest.mark.parametrize("args", [["-h"], ["--help"], *[[c, "-h"] for c in COMMANDS]])
def test_help_is_clean(args: list[str]) -> None:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    assert TYPE_NOISE.search(result.output) is None, result.output
    assert "not built" not in result.output.lower()


def test_unbuilt_options_are_absent_from_help_and_refused_by_name(demo: Path) -> None:
    shown = invoke("serve", "--help")
    assert shown.exit_code == 0 and "--max-context" in shown.output
    help_text = shown.output
    for flag, value in UNBUILT.items():
        assert flag == "--spec" or flag not in help_text
        result = invoke("serve", str(demo), flag, *value)
        assert result.exit_code != 0
        assert isinstance(result.exception, UserError), (flag, result.output)
        assert flag in str(result.exception) and "not supported" in str(result.exception)


def test_spec_mtp_reaches_the_engine_options(monkeypatch: pytest.MonkeyPatch, demo: Path) -> None:
    seen = _record_serve(monkeypatch)
    result = invoke("serve", str(demo), "--spec", "mtp", "--draft-tokens", "4", "--port", "0")
    assert result.exit_code == 0, result.output
    assert seen[0]["options"]["spec"] == "mtp" and seen[0]["options"]["draft_tokens"] == 4
    seen.clear()
    result = invoke("serve", str(demo), "--spec", "mtp", "--lm-head-draft", "--port", "0")
    assert result.exit_code == 0, result.output
    assert seen[0]["options"]["lm_head_draft"] is True
    for bad, needle in (
        (["--spec", "mtp", "--draft-tokens", "6"], "--draft-tokens must be in 1..5"),
        (["--draft-tokens", "2"], "--draft-tokens needs --spec mtp"),
        (["--lm-head-draft"], "--lm-head-draft needs --spec mtp"),
    ):
        result = invoke("serve", str(demo), *bad, "--port", "0")
        assert isinstance(result.exception, UserError), result.output
        assert needle in str(result.exception)


def test_chat_takes_the_same_speculative_options(
    monkeypatch: pytest.MonkeyPatch, demo: Path
) -> None:
    seen = _chat_options(monkeypatch)
    invoke("chat", str(demo), "--spec", "mtp", "--draft-tokens", "2", "--lm-head-draft")
    assert seen[0]["spec"] == "mtp" and seen[0]["draft_tokens"] == 2
    assert seen[0]["lm_head_draft"] is True
    invoke("chat", str(demo))
    assert "spec" not in seen[1] and "lm_head_draft" not in seen[1]
    for bad, needle in (
        (["--spec", "mtp", "--draft-tokens", "6"], "--draft-tokens must be in 1..5"),
        (["--draft-tokens", "2"], "--draft-tokens needs --spec mtp"),
        (["--lm-head-draft"], "--lm-head-draft needs --spec mtp"),
        (["--spec", "dflash"], "--spec dflash is not supported yet in this version of ninfer chat"),
    ):
        result = invoke("chat", str(demo), *bad)
        assert isinstance(result.exception, UserError), result.output
        assert needle in str(result.exception)
    assert len(seen) == 2  # the refused ones never reached the engine


def test_decode_tiles_needs_cuda_and_reaches_the_engine_options(
    monkeypatch: pytest.MonkeyPatch, demo: Path
) -> None:
    """--decode-tiles feeds the CUDA decode kernels: with --device cpu, or `auto` resolved to the
    CPU, it fails by name before the model loads; on a CUDA device it reaches the engine."""
    import ninfer.cli.chat_cmd
    import ninfer.cli.serve_cmd

    seen = _record_serve(monkeypatch)
    for cmd in ("serve", "chat"):
        result = invoke(cmd, str(demo), "--decode-tiles", "--device", "cpu")
        assert isinstance(result.exception, UserError), result.output
        assert "--decode-tiles needs a CUDA device" in str(result.exception)
    for module in (ninfer.cli.serve_cmd, ninfer.cli.chat_cmd):
        monkeypatch.setattr(module, "check_device", lambda device: "cpu")  # auto on a CPU host
    for cmd in ("serve", "chat"):
        result = invoke(cmd, str(demo), "--decode-tiles")
        assert isinstance(result.exception, UserError), result.output
        assert "--decode-tiles needs a CUDA device" in str(result.exception)
    assert seen == []
    monkeypatch.setattr(ninfer.cli.serve_cmd, "check_device", lambda device: "cuda:0")
    result = invoke("serve", str(demo), "--decode-tiles", "--port", "0")
    assert result.exit_code == 0, result.output
    assert seen[0]["options"]["decode_tiles"] is True and seen[0]["options"]["device"] == "cuda:0"
    seen.clear()
    result = invoke("serve", str(demo), "--port", "0")
    assert result.exit_code == 0 and "decode_tiles" not in seen[0]["options"]
    for other in ("--vision", "--kv-dtype-quality"):
        result = invoke("bench", "--synthetic", "qwen3.6-27b", "--decode-tiles", other)
        assert isinstance(result.exception, UserError), result.output
        assert "--decode-tiles applies to the text matrix" in str(result.exception)


@pytest.mark.parametrize("kv_dtype", ["bf16", "fp8", "k8v4"])
def test_kv_dtype_is_accepted(monkeypatch: pytest.MonkeyPatch, demo: Path, kv_dtype: str) -> None:
    seen = _record_serve(monkeypatch)
    result = invoke("serve", str(demo), "--kv-dtype", kv_dtype, "--port", "0")
    assert result.exit_code == 0, result.output
    assert len(seen) == 1 and seen[0]["options"]["kv_dtype"] == kv_dtype


def test_unknown_kv_dtype_is_refused_with_the_known_names(demo: Path) -> None:
    result = invoke("serve", str(demo), "--kv-dtype", "fp4")
    assert result.exit_code != 0 and isinstance(result.exception, UserError)
    message = str(result.exception)
    assert "--kv-dtype" in message and "bf16|int8|fp8|nvfp4|k8v4" in message


def test_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.output.strip() == f"ninfer {ninfer.__version__}"


def test_serve_summary_names_all_three_api_families() -> None:
    top = " ".join(invoke("-h").output.split())
    own = " ".join(invoke("serve", "-h").output.split())
    for text in (top, own):
        for family in ("Chat Completions", "Responses", "Messages"):
            assert family in text


# -- serve hands over what the flags say -------------------------------------------------------
def _record_serve(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replace the server (and its logging setup) with a recorder of what it was handed."""
    import ninfer.server.logs
    import ninfer.server.run

    seen: list[dict[str, Any]] = []

    def fake_serve(artifact: Path, config: Any, engine_options: dict[str, Any], **kw: Any) -> None:
        sock = kw["sock"]
        seen.append(
            {
                "artifact": artifact,
                "config": config,
                "options": engine_options,
                "listening": sock.getsockname(),
                **kw,
            }
        )

    monkeypatch.setattr(ninfer.server.run, "serve", fake_serve)
    monkeypatch.setattr(ninfer.server.logs, "configure_logging", lambda level: None)
    return seen


def test_vllm_aliases_set_the_same_options(monkeypatch: pytest.MonkeyPatch, demo: Path) -> None:
    seen = _record_serve(monkeypatch)
    args = ["--max-model-len", "300", "--served-model-name", "my-model", "--max-num-seqs", "2"]
    result = invoke("serve", str(demo), "--port", "0", *args)
    assert result.exit_code == 0, result.output
    (handed,) = seen
    assert handed["options"]["max_context"] == 300
    assert handed["options"]["max_concurrency"] == 2
    assert handed["config"].model_id == "my-model"


def test_an_alias_agreeing_with_its_option_is_fine_and_a_conflict_is_refused(
    monkeypatch: pytest.MonkeyPatch, demo: Path
) -> None:
    seen = _record_serve(monkeypatch)
    ok = invoke("serve", str(demo), "--port", "0", "--max-context", "300", "--max-model-len", "300")
    assert ok.exit_code == 0, ok.output
    assert seen[0]["options"]["max_context"] == 300
    bad = invoke("serve", str(demo), "--port", "0", "--max-num-seqs", "2", "--max-concurrency", "3")
    assert isinstance(bad.exception, UserError)
    assert "--max-num-seqs 2 conflicts with --max-concurrency 3" in str(bad.exception)


def test_serve_binds_its_port_first_and_reports_the_real_one(
    monkeypatch: pytest.MonkeyPatch, demo: Path
) -> None:
    seen = _record_serve(monkeypatch)
    result = invoke("serve", str(demo), "--port", "0")
    assert result.exit_code == 0, result.output
    (handed,) = seen
    host, port = handed["listening"]
    assert host == "127.0.0.1" and port > 0
    assert handed["config"].port == port  # the ready line shows the port actually bound
    assert handed["artifact"] == demo


# -- one --device form ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "device"),
    [
        ("auto", "auto"),
        ("cpu", "cpu"),
        ("CPU", "cpu"),
        ("cuda", "cuda"),
        ("cuda:1", "cuda:1"),
        ("1", "cuda:1"),
        ("0", "cuda:0"),
    ],
)
def test_device_forms(text: str, device: str) -> None:
    from ninfer.cli.device import parse_device

    assert parse_device(text) == device


@pytest.mark.parametrize("text", ["gpu0", "cuda:", "cuda:x", "-1", "mps", ""])
def test_bad_device_forms(text: str) -> None:
    from ninfer.cli.device import parse_device

    with pytest.raises(UserError, match="expected auto, cpu, cuda, cuda:N or N"):
        parse_device(text)


def _chat_options(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    import ninfer.cli.chat_cmd as chat_cmd

    seen: list[dict[str, Any]] = []

    class Loaded(Exception):
        pass

    def fake_load(path: Path, options: dict[str, Any], **kw: Any) -> Any:
        seen.append(options)
        raise Loaded

    monkeypatch.setattr(chat_cmd, "load_engine", fake_load)
    return seen


def _expected_device(text: str) -> str | None:
    """What serve and chat should hand the engine for `text` here (None: refused, no GPU)."""
    gpu = torch.cuda.is_available()
    if text == "auto":
        return "cuda:0" if gpu else "cpu"
    if text == "cpu":
        return "cpu"
    return (text if text == "cuda" else "cuda:0") if gpu else None


@pytest.mark.parametrize("text", ["auto", "cpu", "0", "cuda", "cuda:0"])
def test_serve_and_chat_read_device_the_same_way(
    monkeypatch: pytest.MonkeyPatch, demo: Path, text: str
) -> None:
    served = _record_serve(monkeypatch)
    chatted = _chat_options(monkeypatch)
    results = [
        invoke("serve", str(demo), "--port", "0", "--device", text),
        invoke("chat", str(demo), "--device", text),
    ]
    expected = _expected_device(text)
    if expected is not None:
        assert served[0]["options"]["device"] == expected
        assert chatted[0]["device"] == expected
    else:  # no GPU here: both refuse the same way, before loading
        for result in results:
            assert isinstance(result.exception, UserError)
            assert "no CUDA device is available" in str(result.exception)
        assert not served and not chatted


def test_bench_reads_device_the_same_way(monkeypatch: pytest.MonkeyPatch) -> None:
    import ninfer.bench.run as run

    seen: list[str] = []

    def fake_run_bench(opts: Any, on_progress: Any) -> Any:
        seen.append(opts.device)
        raise run.BenchError("stop here")

    monkeypatch.setattr(run, "run_bench", fake_run_bench)
    for text in ("auto", "cuda", "1", "cuda:1"):
        invoke("bench", "--synthetic", "tiny-dense", "--device", text)
    assert seen == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]
    refused = invoke("bench", "--synthetic", "tiny-dense", "--device", "cpu")
    assert isinstance(refused.exception, UserError)
    assert "needs a CUDA device" in str(refused.exception)


# -- chat checks its flags before loading ----------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temperature", "nan"], "--temperature"),
        (["--presence-penalty", "inf"], "--presence-penalty"),
        (["--seed", str(2**64)], "--seed"),
        (["--max-context", "1"], "--max-context"),
        (["--dtype", "fp16"], "--dtype"),
    ],
)
def test_chat_validates_flags_before_loading(
    monkeypatch: pytest.MonkeyPatch, demo: Path, args: list[str], message: str
) -> None:
    loaded = _chat_options(monkeypatch)
    result = invoke("chat", str(demo), *args)
    assert result.exit_code != 0
    assert message in (str(result.exception) + result.output)
    assert not loaded


def test_chat_hands_valid_sampling_flags_to_the_engine(
    monkeypatch: pytest.MonkeyPatch, demo: Path
) -> None:
    loaded = _chat_options(monkeypatch)
    args = ["--temperature", "0.5", "--top-k", "7", "--min-p", "0.1", "--max-model-len", "256"]
    invoke("chat", str(demo), *args, "--device", "cpu")
    (options,) = loaded
    assert options["temperature"] == 0.5 and options["top_k"] == 7 and options["min_p"] == 0.1
    assert options["max_context"] == 256


# -- inspect-artifact --json --verify -------------------------------------------------------------
def test_inspect_json_verify_reports_the_result(tmp_path: Path, demo: Path) -> None:
    good = invoke("inspect-artifact", str(demo), "--json", "--verify")
    assert good.exit_code == 0, good.output
    info = json.loads(good.output)
    assert info["verify"] == {
        "ok": True,
        "tensors_checked": info["num_tensors"],
        "failures": [],
    }
    assert "verify" not in json.loads(invoke("inspect-artifact", str(demo), "--json").output)

    from ninfer.artifact.reader import Artifact

    bad = tmp_path / "bad.ninfer"
    bad.write_bytes(demo.read_bytes())
    with Artifact(demo) as art:
        entry = art.header.tensors["text.norm.weight"]
        offset = art.preamble.data_offset + entry.offset
    with open(bad, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    result = invoke("inspect-artifact", str(bad), "--json", "--verify")
    assert result.exit_code == 2
    report = json.loads(result.output)["verify"]
    assert report["ok"] is False and report["tensors_checked"] == info["num_tensors"]
    assert report["failures"] == [
        {
            "tensor": "text.norm.weight",
            "code": "checksum_mismatch",
            "problem": "tensor 'text.norm.weight' fails its checksum (data corrupted)",
        }
    ]
    table = invoke("inspect-artifact", str(bad), "--verify")
    assert isinstance(table.exception, UserError)
    assert "1 of" in str(table.exception) and "text.norm.weight" in str(table.exception)


# -- convert: --force, and no partial output after any failure -------------------------------------
@pytest.fixture
def tiny_checkpoint(tmp_path: Path) -> Path:
    from ninfer.testing import TinySpec, make_tiny_checkpoint

    return make_tiny_checkpoint(
        tmp_path / "hf", TinySpec(kind="dense", vocab_size=512, with_vision=False), seed=0
    )


def test_convert_force_overwrites(tiny_checkpoint: Path, tmp_path: Path) -> None:
    from ninfer.artifact.reader import Artifact

    out = tmp_path / "out.ninfer"
    out.write_bytes(b"old")
    refused = invoke("convert", str(tiny_checkpoint), str(out))
    assert isinstance(refused.exception, UserError) and out.read_bytes() == b"old"
    result = invoke("convert", str(tiny_checkpoint), str(out), "--force", "--name", "tiny")
    assert result.exit_code == 0, result.output
    with Artifact(out) as art:
        assert art.name == "tiny"


def test_convert_removes_its_partial_output_when_the_disk_fills(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    out = tmp_path / "out.ninfer"
    result = invoke("convert", str(tiny_checkpoint), str(out))
    assert result.exit_code != 0
    assert "no space left on device" in str(result.exception)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_convert_removes_its_partial_output_when_terminated(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ninfer.artifact.convert as converter

    real = converter.convert

    def terminated_midway(hf_dir: Path, out: Path, **kw: Any) -> Any:
        def progress(tensor: str, done: int, total: int) -> None:
            kw["progress"](tensor, done, total)
            if done == 3:
                assert len(list(out.parent.glob(out.name + ".*.partial"))) == 1
                os.kill(os.getpid(), signal.SIGTERM)

        return real(hf_dir, out, **{**kw, "progress": progress})

    monkeypatch.setattr(converter, "convert", terminated_midway)
    # stands in for the default action (which would end pytest): only notes that it ran, so a
    # convert that installs no handler of its own finishes and fails the checks below
    unhandled: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: unhandled.append(signum))
    try:
        out = tmp_path / "out.ninfer"
        result = invoke("convert", str(tiny_checkpoint), str(out))
        assert result.exit_code == 128 + signal.SIGTERM
        assert not unhandled
        assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
        assert signal.getsignal(signal.SIGTERM) is not None  # convert restored ours
    finally:
        signal.signal(signal.SIGTERM, before)


def test_check_device_keeps_a_present_cuda_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """A named GPU the machine has passes through unchanged (serve hands it to the engine)."""
    import torch

    from ninfer.cli.device import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == "cuda:1"
    assert check_device("cuda") == "cuda"
    assert check_device("auto") == "cuda:0"
    with pytest.raises(UserError, match="2 CUDA device"):
        check_device("cuda:2")
