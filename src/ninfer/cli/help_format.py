"""Command classes whose `--help` shows no type noise (`<bool>`, `<path>`).

Typer prints a type column for every parameter; options here carry their own metavars (see
options.py), and these classes blank the two that cannot carry one: the help flag itself and
positional arguments (whose metavar already says what they are).
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup


def _no_type(ctx: Any) -> None:
    return None


def _clean(params: list[Any], help_option: Any) -> None:
    if help_option is not None:
        help_option.metavar = ""
    for param in params:
        if isinstance(param, TyperArgument):
            param.display_type_rich = _no_type  # type: ignore[method-assign]


class CleanCommand(TyperCommand):
    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        _clean(self.params, option)
        return option


class CleanGroup(TyperGroup):
    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)
        _clean(self.params, option)
        return option
