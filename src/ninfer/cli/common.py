"""Helpers shared by subcommands: the artifact (or the demo, built on first use) and the engine,
both with progress on stderr.

Progress goes through `StepProgress`, so a terminal sees a live bar and a pipe sees a few plain
lines; `emit` lets `serve` turn those lines into its timestamped log records.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ninfer.cli.checks import check_artifact_path
from ninfer.cli.progress import Emit, StepProgress

if TYPE_CHECKING:
    from ninfer.api import Engine


def resolve_artifact(path: Path | None, *, emit: Emit | None = None) -> Path:
    """The given artifact, or the demo artifact (built on first use) when none was given."""
    check_artifact_path(path)
    if path is not None:
        return path
    from ninfer.artifact.demo import demo_path, ensure_demo

    target = demo_path()
    if target.is_file():
        return target
    label = f"building the demo artifact (tiny model, RANDOM weights) at {target}"
    with StepProgress(label, unit="tensors", emit=emit) as bar:
        ensure_demo(target, progress=bar.callback())
        bar.done(f"built the demo artifact {target} in {bar.elapsed():.1f}s")
    return target


def load_engine(
    path: Path,
    options: dict[str, Any],
    *,
    emit: Emit | None = None,
    announce: bool = True,
    on_graph_capture: Callable[[int, int, float], None] | None = None,
) -> Engine:
    """`Engine` over the artifact at `path`, reporting the weight reading and binding.

    `announce=False` leaves the closing line to the caller (serve logs its own "engine ready").
    `on_graph_capture` hears of each CUDA graph the engine captures (on first use of a shape).
    """
    from ninfer.api import Engine
    from ninfer.artifact.reader import Artifact
    from ninfer.engine.options import EngineOptions, resolve_device

    engine_options = EngineOptions.from_kwargs(**options)
    device = resolve_device(engine_options.device)
    with StepProgress("loading the model", unit="bytes", emit=emit) as bar:
        report = bar.callback()

        def weights(tensor: str, done: int, total: int) -> None:
            report(tensor, done, total)
            if done == total:
                bar.phase(f"placing the weights on {device}")

        artifact = Artifact(path, progress=weights)
        try:
            engine = Engine.from_artifact(
                artifact, engine_options, on_graph_capture=on_graph_capture
            )
        except BaseException:
            artifact.close()
            raise
        if announce:
            bar.done(f"loaded {engine.model_id} in {bar.elapsed():.1f}s")
        else:
            bar.close()
    return engine
