"""The `ninfer` command: a Typer app whose subcommands live one per module.

Commands stay thin (parse, build, hand over). Every expected failure is a typed ninfer error that
`main()` prints as one line on stderr with exit code 2, never as a traceback.
"""

from __future__ import annotations

import sys

import typer

from ninfer.cli import (
    bench_cmd,
    chat_cmd,
    convert_cmd,
    count_tokens_cmd,
    inspect_cmd,
    serve_cmd,
)

app = typer.Typer(
    name="ninfer",
    help="Inference engine and server for the Qwen3.5 model family.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("inspect-artifact")(inspect_cmd.inspect_artifact)
app.command("count-tokens")(count_tokens_cmd.count_tokens)
app.command("convert")(convert_cmd.convert)
app.command("serve")(serve_cmd.serve)
app.command("chat")(chat_cmd.chat)
app.command("bench")(bench_cmd.bench)


def main() -> None:
    from ninfer.cli.errors import UserError, user_error_types

    try:
        app()
    except user_error_types() as e:
        msg = str(e)
        UserError.print(msg)
        sys.exit(2)


if __name__ == "__main__":
    main()
