"""`ninfer convert`: Hugging Face checkpoint directory -> `.ninfer` artifact, with progress.

An existing output is refused unless `--force`; the converter writes a partial file of its own
beside OUT (`OUT.<random>.partial`) and renames it only when complete; on any failure (Ctrl-C
and SIGTERM included, which this command turns into an unwinding exit) the writer removes it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import typer

from ninfer.cli.checks import load_template
from ninfer.cli.errors import UserError
from ninfer.cli.options import opt
from ninfer.cli.progress import StepProgress


def convert(
    hf_dir: Path = typer.Argument(..., help="Hugging Face checkpoint directory.", metavar="HF_DIR"),
    out: Path = typer.Argument(..., help="Output artifact file (.ninfer).", metavar="OUT"),
    name: str | None = opt(
        None, "--name", help="Public model id stored in the artifact.", metavar="ID"
    ),
    weights: str = opt("bf16", "--weights", help="Weight format: bf16 or fp8.", metavar="bf16|fp8"),
    components: str | None = opt(
        None,
        "--components",
        help="Comma list of text, mtp, vision (default: all present).",
        metavar="LIST",
    ),
    chat_template: Path | None = opt(
        None, "--chat-template", help="Embed this Jinja template as the default.", metavar="FILE"
    ),
    force: bool = opt(False, "--force", help="Overwrite OUT if it exists."),
) -> None:
    """Convert a Qwen3.5 / Qwen3.5-MoE checkpoint (bf16 or FP8) into one artifact file."""
    from ninfer.artifact.convert import convert as run_convert

    if weights not in ("bf16", "fp8"):
        raise UserError(f"--weights must be bf16 or fp8, not {weights!r}")
    if not hf_dir.is_dir():
        what = "is a file, not" if hf_dir.exists() else "no such"
        raise UserError(f"{hf_dir}: {what} checkpoint directory")
    if out.is_dir():
        raise UserError(f"{out}: is a directory; give the output artifact's file name")
    if out.exists() and not force:
        raise UserError(f"{out}: already exists (add --force to overwrite it)")
    _check_writable(out)
    if chat_template is not None:
        load_template(chat_template)
    parts = [c.strip() for c in components.split(",") if c.strip()] if components else None
    with _exit_on_sigterm(), StepProgress(f"converting {hf_dir.name}", unit="tensors") as bar:
        result = run_convert(
            hf_dir,
            out,
            name=name,
            weights=weights,  # type: ignore[arg-type]
            components=parts,
            chat_template=chat_template,
            progress=bar.callback(),
        )
        bar.done(
            f"wrote {result.path} ({result.num_tensors} tensors, "
            f"{result.num_bytes / 2**20:.1f} MiB, components {', '.join(result.components)}) "
            f"in {bar.elapsed():.1f}s"
        )
    if result.ignored_keys:
        typer.echo(
            f"ignored {len(result.ignored_keys)} source tensors not used by ninfer, e.g. "
            f"{result.ignored_keys[0]}",
            err=True,
        )


@contextmanager
def _exit_on_sigterm() -> Iterator[None]:
    """SIGTERM (`kill`, `timeout`) unwinds like Ctrl-C, so the partial output is removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check_writable(out: Path) -> None:
    """Fail before reading the checkpoint when OUT cannot be created where it is asked for."""
    ancestor = out.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserError(f"{out}: cannot be written, {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"{out}: cannot be written, {ancestor} is not writable")
