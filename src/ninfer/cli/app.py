"""The `ninfer` command: a Typer app whose subcommands live one per module.

Commands stay thin (parse, check, build, hand over). Every expected failure is a typed ninfer
error, or an OS error about a file the user named, that `main()` prints as one line on stderr with
exit code 2, never as a traceback; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys

import typer
from typer._click.exceptions import ClickException

import ninfer
from ninfer.cli import (
    bench_cmd,
    chat_cmd,
    convert_cmd,
    count_tokens_cmd,
    inspect_cmd,
    serve_cmd,
)
from ninfer.cli.help_format import CleanCommand, CleanGroup

app = typer.Typer(
    name="ninfer",
    help="Inference engine and server for the Qwen3.5 model family.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    cls=CleanGroup,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ninfer {ninfer.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        "-V",
        help="Print the version and exit.",
        callback=_version,
        is_eager=True,
        metavar="",
        show_default=False,
    ),
) -> None:
    """Inference engine and server for the Qwen3.5 model family."""


app.command("inspect-artifact", cls=CleanCommand)(inspect_cmd.inspect_artifact)
app.command("count-tokens", cls=CleanCommand)(count_tokens_cmd.count_tokens)
app.command("convert", cls=CleanCommand)(convert_cmd.convert)
app.command("serve", cls=CleanCommand)(serve_cmd.serve)
app.command("chat", cls=CleanCommand)(chat_cmd.chat)
app.command("bench", cls=CleanCommand)(bench_cmd.bench)


def main() -> None:
    from ninfer.cli.errors import UserError, os_error_message, user_error_types

    try:
        code = app(prog_name="ninfer", standalone_mode=False)
    except ClickException as e:  # a usage mistake: one line, with where to find the usage
        if e.format_message():  # empty: no arguments at all, and the help was shown
            UserError.print(_usage_message(e))
        sys.exit(e.exit_code)
    except typer.Abort:
        UserError.print("aborted")
        sys.exit(1)
    except user_error_types() as e:
        UserError.print(str(e))
        sys.exit(2)
    except OSError as e:  # a file or address the user named: unreadable, unwritable, missing
        UserError.print(os_error_message(e))
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_message(e: ClickException) -> str:
    message = e.format_message()
    ctx = getattr(e, "ctx", None)
    if ctx is not None:
        message += f" (see {ctx.command_path} -h)"
    return message


if __name__ == "__main__":
    main()
