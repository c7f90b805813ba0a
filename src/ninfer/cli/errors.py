"""Which exceptions are the user's problem (one line, exit 2) rather than ninfer's bug.

Typed ninfer errors (artifact, template, UserError) and OS errors about a named file print as
`error: <what>: <problem>` on stderr; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

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


def os_error_message(e: OSError) -> str:
    """`<file>: <reason>` for an OS error, without Python's errno prefix."""
    reason = (e.strerror or str(e) or type(e).__name__).lower()
    return f"{e.filename}: {reason}" if e.filename is not None else reason
