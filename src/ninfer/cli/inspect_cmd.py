"""`ninfer inspect-artifact`: what an artifact holds, as rich tables or JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from ninfer.cli import options as o
from ninfer.cli.common import resolve_artifact
from ninfer.cli.errors import UserError

if TYPE_CHECKING:
    from ninfer.artifact.reader import Artifact


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def verify_tensors(art: Artifact) -> dict[str, Any]:
    """Check every tensor's CRC; the result lists each failing tensor instead of stopping."""
    from ninfer.artifact.errors import ArtifactError

    failures = []
    names = list(art.header.tensors)
    for name in names:
        try:
            art.tensor(name, verify=True)
        except ArtifactError as e:
            failures.append({"tensor": name, "code": e.code, "problem": e.problem})
    return {"ok": not failures, "tensors_checked": len(names), "failures": failures}


def inspect_artifact(
    path: Path | None = o.artifact_argument(),
    as_json: bool = o.opt(False, "--json", help="Print the summary as JSON."),
    verify: bool = o.opt(
        False,
        "--verify",
        help="Also check every tensor's checksum (exit 2 when any fails; with --json the "
        "result is the summary's `verify` object).",
    ),
) -> None:
    """Show an artifact's metadata, components, config, tensors and chat templates."""
    from ninfer.artifact.reader import Artifact
    from ninfer.artifact.summary import summarize

    with Artifact(resolve_artifact(path)) as art:
        info = summarize(art)
        if verify:
            info["verify"] = verify_tensors(art)
    failed = verify and not info["verify"]["ok"]
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        if failed:
            raise typer.Exit(2)
        return
    if failed:
        bad = info["verify"]["failures"]
        raise UserError(
            f"{info['path']}: {len(bad)} of {info['verify']['tensors_checked']} tensors fail "
            f"their checksum, first {bad[0]['tensor']!r} (data corrupted)"
        )
    con = Console()
    meta = info["metadata"]
    if meta.get("random_weights"):
        con.print(
            "[bold yellow]RANDOM WEIGHTS[/]: this artifact is a demo; its output is meaningless."
        )
    t = Table(title=f"{info['path']} ({_size(info['file_bytes'])})", show_header=False)
    for k in ("name", "architecture", "producer", "weights", "random_weights", "tokenizer_source"):
        t.add_row(k, str(meta.get(k)))
    t.add_row("components", ", ".join(info["components"]))
    if verify:
        t.add_row("checksums", f"all {info['verify']['tensors_checked']} tensors verified")
    con.print(t)
    c = Table(title="config", show_header=False)
    for k, v in info["config"].items():
        c.add_row(k, str(v))
    con.print(c)
    ts = Table(title=f"tensors ({info['num_tensors']})")
    for col in ("component", "format", "count", "bytes"):
        ts.add_column(col, justify="right" if col in ("count", "bytes") else "left")
    for row in info["tensors"]:
        ts.add_row(row["component"], row["format"], str(row["count"]), _size(row["bytes"]))
    con.print(ts)
    tt = Table(title="chat templates")
    tt.add_column("name")
    tt.add_column("chars", justify="right")
    tt.add_column("default")
    for name, d in info["chat_templates"].items():
        tt.add_row(name, str(d["chars"]), "yes" if d["default"] else "")
    con.print(tt)
    if info.get("vision"):
        vt = Table(title="vision tower", show_header=False)
        for k, v in info["vision"].items():
            vt.add_row(k, str(v))
        con.print(vt)
    if info.get("media"):
        mt = Table(title="media preprocessing")
        mt.add_column("setting")
        mt.add_column("image")
        mt.add_column("video")
        image, video = info["media"]["image"], info["media"]["video"]
        for k in dict.fromkeys([*image, *video]):
            mt.add_row(k, str(image.get(k, "")), str(video.get(k, "")))
        con.print(mt)
    gen = info["generation"]
    con.print(f"eos ids: {gen.get('eos_token_ids')}; presets: {', '.join(gen.get('presets', {}))}")
