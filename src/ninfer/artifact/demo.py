"""The demo artifact: a tiny Qwen3.5-shaped model with RANDOM weights, built on first use.

It lets every command run on a fresh clone without downloading a model. It is built from
`ninfer.testing`'s deterministic tiny checkpoint and converted like any real checkpoint, so the
demo also exercises the converter. Its name and metadata say loudly that its output is gibberish.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

Progress = Callable[[str, int, int], None]  # (tensor name, done, total), as the converter reports

DEMO_NAME = "ninfer-demo-random"
DEMO_DESCRIPTION = (
    "Tiny Qwen3.5-shaped model with RANDOM weights (real tokenizer and chat template) for demos "
    "and tests; its output is meaningless."
)


def demo_path() -> Path:
    """`artifacts/demo.ninfer` of a source checkout, else the user cache; $NINFER_DEMO overrides."""
    env = os.environ.get("NINFER_DEMO")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    if (repo / "pyproject.toml").is_file() and (repo / "artifacts").is_dir():
        return repo / "artifacts" / "demo.ninfer"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ninfer"
    return cache / "demo.ninfer"


def ensure_demo(
    path: Path | None = None, *, seed: int = 0, progress: Progress | None = None
) -> Path:
    """Return the demo artifact's path, building it first if it does not exist yet.

    `progress` receives the converter's `(tensor, done, total)` reports while it is built.
    """
    from ninfer.artifact.convert import convert
    from ninfer.testing import TinySpec, make_tiny_checkpoint

    path = path or demo_path()
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ninfer-demo-") as tmp:
        ckpt = make_tiny_checkpoint(Path(tmp) / "hf", TinySpec(kind="dense"), seed=seed)
        convert(ckpt, path, name=DEMO_NAME, random_weights=True, progress=progress)
    return path
