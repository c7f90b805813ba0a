"""Subcommands of the design card that do not exist yet: listed in --help, fail explicitly."""

from __future__ import annotations

from collections.abc import Callable

import typer

COMMANDS: dict[str, str] = {}
CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}


def make(name: str) -> Callable[[typer.Context], None]:
    def command(ctx: typer.Context) -> None:
        from ninfer.cli.errors import UserError

        UserError.print(f"`ninfer {name}` is not supported yet in this version of ninfer")
        raise typer.Exit(code=2)

    command.__name__ = name.replace("-", "_")
    return command
