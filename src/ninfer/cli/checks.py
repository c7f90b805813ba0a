"""Checks every command runs before anything heavy loads: files, engine options, sampling flags.

A mistake found after a multi-gigabyte model load costs the user a minute; these checks need no
model. Each failure is a UserError naming the flag or file, in the words the user typed.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from ninfer.cli.errors import UserError, os_error_message


def flag_name(field: str) -> str:
    """The command-line spelling of an engine option or sampling field."""
    return "--" + field.replace("_", "-")


def read_user_file(path: Path, what: str) -> str:
    """The text of a file the user named; a UserError saying what is wrong with it otherwise."""
    if path.is_dir():
        raise UserError(f"{path}: {what} is a directory, not a file")
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: {what} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise UserError(f"{what} {os_error_message(e)}") from None


def check_artifact_path(path: Path | None) -> None:
    """An artifact the user named must be an existing file (None: the demo, built on demand)."""
    if path is None:
        return
    if path.is_dir():
        raise UserError(f"{path}: is a directory, not an artifact file (.ninfer)")
    if not path.exists():
        raise UserError(f"{path}: no such artifact file")


def load_template(path: Path) -> str:
    """A `--chat-template` file's source, compiled once so a syntax error surfaces now."""
    from ninfer.chat.template import ChatTemplate

    source = read_user_file(path, "chat template")
    ChatTemplate(source)  # TemplateError (a user error) names the problem
    return source


def check_sampling(values: dict[str, Any]) -> None:
    """Sampling overrides (None: not given) must be in the spec's ranges."""
    from ninfer.engine.sampling import SamplingParamError, SamplingParams

    known = {f.name for f in fields(SamplingParams)}
    for name, value in values.items():
        if value is None or name not in known:
            continue
        try:
            SamplingParams(**{name: value}).validate()
        except SamplingParamError as e:
            reason = str(e).removeprefix(f"{e.field} ")
            raise UserError(f"{flag_name(e.field)} {reason}") from None


def check_engine_options(options: dict[str, Any]) -> None:
    """The engine's own validation of its options, reported with flag names."""
    from ninfer.engine.options import EngineOptions

    try:
        EngineOptions.from_kwargs(**options).validate()
    except ValueError as e:
        message = str(e)
        for f in fields(EngineOptions):
            if message.startswith(f.name + " "):
                message = flag_name(f.name) + message[len(f.name) :]
                break
        raise UserError(message) from None
