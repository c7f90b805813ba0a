"""`ninfer convert`: Hugging Face checkpoint directory -> `.ninfer` artifact, with progress."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ninfer.cli.errors import UserError


def convert(
    hf_dir: Path = typer.Argument(..., help="Hugging Face checkpoint directory."),
    out: Path = typer.Argument(..., help="Output artifact path (.ninfer)."),
    name: str | None = typer.Option(None, "--name", help="Public model id stored in the artifact."),
    weights: str = typer.Option("bf16", "--weights", help="Weight format: bf16 or fp8."),
    components: str | None = typer.Option(
        None, "--components", help="Comma list of text,mtp,vision (default: all present)."
    ),
    chat_template: Path | None = typer.Option(
        None, "--chat-template", help="Embed this Jinja template as the default."
    ),
) -> None:
    """Convert a Qwen3.5 / Qwen3.5-MoE checkpoint (bf16 or FP8) into one artifact file."""
    from ninfer.artifact.convert import convert as run_convert

    if weights not in ("bf16", "fp8"):
        raise UserError(f"--weights must be bf16 or fp8, not {weights!r}")
    parts = [c.strip() for c in components.split(",") if c.strip()] if components else None
    console = Console(stderr=True)
    bar = Progress(
        TextColumn("[bold]converting"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        console=console,
    )
    task = bar.add_task("", total=None)

    def progress(tensor: str, done: int, total: int) -> None:
        if not bar.live.is_started:  # start only once the source validated: errors stay one line
            bar.start()
        bar.update(task, completed=done, total=total, description=tensor)

    try:
        result = run_convert(
            hf_dir,
            out,
            name=name,
            weights=weights,  # type: ignore[arg-type]
            components=parts,
            chat_template=chat_template,
            progress=progress,
        )
    finally:
        bar.stop()
    console.print(
        f"wrote {result.path} ({result.num_tensors} tensors, {result.num_bytes / 2**20:.1f} MiB, "
        f"components {', '.join(result.components)})",
        highlight=False,
    )
    if result.ignored_keys:
        console.print(
            f"ignored {len(result.ignored_keys)} source tensors not used by ninfer, e.g. "
            f"{result.ignored_keys[0]}",
            highlight=False,
        )
