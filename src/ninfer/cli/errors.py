"""Which exceptions are the user's problem (one line, exit 2) rather than ninfer's bug."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape


class UserError(Exception):
    """A CLI-level usage problem (bad file, bad option combination)."""

    @staticmethod
    def print(message: str) -> None:
        Console(stderr=True, soft_wrap=True).print(
            f"[bold red]error:[/] {escape(message)}", highlight=False
        )


def user_error_types() -> tuple[type[BaseException], ...]:
    from ninfer.artifact.errors import ArtifactError

    types: list[type[BaseException]] = [UserError, ArtifactError]
    try:
        from ninfer.chat.template import TemplateError

        types.append(TemplateError)
    except ImportError:  # pragma: no cover - only while the chat package is incomplete
        pass
    return tuple(types)


def fail(message: str) -> None:
    """Raise a UserError; callers use it for messages that need no extra context."""
    raise UserError(message)


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()
