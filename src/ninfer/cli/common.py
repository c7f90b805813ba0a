"""Helpers shared by subcommands: artifact resolution with the demo fallback."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console


def resolve_artifact(path: Path | None) -> Path:
    """The given artifact, or the demo artifact (built on first use) when none was given."""
    if path is not None:
        return path
    from ninfer.artifact.demo import demo_path, ensure_demo

    target = demo_path()
    if not target.is_file():
        Console(stderr=True).print(
            f"building the demo artifact (tiny model, RANDOM weights) at {target} ...",
            highlight=False,
        )
    return ensure_demo(target)
