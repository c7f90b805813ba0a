"""`ninfer chat`: a terminal REPL over `Engine.chat`, streaming reasoning (dimmed) and content.

Owns the REPL only: multi-line input, slash commands and the conversation history; it reaches the
engine through `ninfer.api` and never touches the scheduler. Input is plain `input()` (readline
editing when available) so it works in any terminal, tmux included. Ctrl-C during an answer closes
the event iterator, which cancels the engine request, and the session carries on.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from ninfer.cli import options as o
from ninfer.cli.checks import (
    check_artifact_path,
    check_engine_options,
    check_sampling,
    load_template,
)
from ninfer.cli.common import load_engine, resolve_artifact
from ninfer.cli.device import check_device, parse_device
from ninfer.cli.errors import UserError

if TYPE_CHECKING:
    from ninfer.api import ChatEvent, Engine

PROMPT = ">>> "
MORE = "... "
CONTINUATION = "\\"
FENCE = '"""'
HELP = (
    "commands: /reset  /think on|off  /system TEXT (no TEXT clears it)  /help  /exit\n"
    'multi-line: end a line with \\ to continue it, or wrap a block in """ ... """\n'
    "Ctrl-C stops an answer; Ctrl-C or Ctrl-D at the prompt quits"
)


class ChatCommandError(Exception):
    """A slash command the REPL does not understand (shown, then the prompt returns)."""


# -- input ----------------------------------------------------------------------------------------
def read_message(read: Callable[[str], str] = input) -> str:
    """One user message, possibly over several lines; EOFError / KeyboardInterrupt pass through.

    A line ending in a backslash continues on the next line (the backslash is dropped). A message
    whose first line starts with triple quotes runs until a line that ends with triple quotes;
    the quotes themselves are not part of the message.
    """
    line = read(PROMPT)
    if line.lstrip().startswith(FENCE):
        body = line.lstrip()[len(FENCE) :]
        if body.rstrip().endswith(FENCE):  # """one line"""
            return body.rstrip()[: -len(FENCE)]
        lines = [body] if body else []
        while True:
            line = read(MORE)
            if line.rstrip().endswith(FENCE):
                tail = line.rstrip()[: -len(FENCE)]
                if tail:
                    lines.append(tail)
                return "\n".join(lines)
            lines.append(line)
    lines = []
    while line.endswith(CONTINUATION):
        lines.append(line[: -len(CONTINUATION)])
        line = read(MORE)
    lines.append(line)
    return "\n".join(lines)


# -- commands and history -------------------------------------------------------------------------
class CommandKind(enum.Enum):
    RESET = "reset"
    THINK = "think"
    SYSTEM = "system"
    IMAGE = "image"
    HELP = "help"
    EXIT = "exit"


@dataclass(frozen=True)
class Command:
    kind: CommandKind
    arg: str = ""


def parse_command(text: str) -> Command | None:
    """The slash command in `text`, or None when it is an ordinary message."""
    if not text.startswith("/"):
        return None
    name, _, arg = text[1:].partition(" ")
    name = name.strip().lower()
    aliases = {"quit": CommandKind.EXIT, "clear": CommandKind.RESET}
    kind = aliases.get(name) or next((k for k in CommandKind if k.value == name), None)
    if kind is None:
        raise ChatCommandError(f"unknown command /{name} (try /help)")
    arg = arg.strip()
    if kind == CommandKind.THINK and arg.lower() not in ("on", "off"):
        raise ChatCommandError("usage: /think on|off")
    if kind == CommandKind.IMAGE and not arg:
        raise ChatCommandError("usage: /image PATH (attaches the image to your next message)")
    return Command(kind, arg)


def image_data_uri(path: str) -> str:
    """A local image file as a data URI (the engine decodes the bytes again; the type is a
    label). Decoded once here so that a file that is not an image fails at `/image`, not at
    the next message."""
    import base64
    import mimetypes

    from ninfer.media.errors import MediaError
    from ninfer.media.image import decode_image

    file = Path(path).expanduser()
    try:
        data = file.read_bytes()
    except OSError as e:
        raise ChatCommandError(f"cannot read {file}: {e.strerror or e}") from None
    try:
        decode_image(data)
    except MediaError as e:
        raise ChatCommandError(f"{file}: {e.message}") from None
    mime = mimetypes.guess_type(file.name)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@dataclass
class ChatSession:
    """The conversation so far and the settings the next turn is rendered with."""

    enable_thinking: bool = True
    system_prompt: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    images: list[str] = field(default_factory=list)  # attached to the next user message
    vision: bool = True  # the engine has its vision tower: /image is refused without it

    def user_content(self, user_text: str) -> str | list[dict[str, str]]:
        if not self.images:
            return user_text
        parts = [{"type": "image", "image": uri} for uri in self.images]
        return [*parts, {"type": "text", "text": user_text}]

    def messages(self, user_text: str) -> list[dict[str, Any]]:
        """The messages for the next turn; the system prompt is applied fresh each turn."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        user = {"role": "user", "content": self.user_content(user_text)}
        return [*system, *self.history, user]

    def record(self, user_text: str, content: str, reasoning: str) -> None:
        # reasoning_content lets the template decide whether earlier thinking stays in the prompt
        assistant: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            assistant["reasoning_content"] = reasoning
        self.history += [{"role": "user", "content": self.user_content(user_text)}, assistant]
        self.images.clear()

    def apply(self, command: Command) -> str:
        """Carry out a non-exit command; returns the line to show the user."""
        if command.kind == CommandKind.RESET:
            self.history.clear()
            self.images.clear()
            return "history cleared"
        if command.kind == CommandKind.IMAGE:
            if not self.vision:
                raise ChatCommandError(
                    "/image needs the vision tower: start ninfer chat with --vision"
                )
            self.images.append(image_data_uri(command.arg))
            n = len(self.images)
            return f"image attached to your next message ({n} pending)"
        if command.kind == CommandKind.THINK:
            self.enable_thinking = command.arg.lower() == "on"
            return f"thinking {'on' if self.enable_thinking else 'off'}"
        if command.kind == CommandKind.SYSTEM:
            self.system_prompt = command.arg
            return "system prompt set" if command.arg else "system prompt cleared"
        if command.kind == CommandKind.HELP:
            return HELP
        raise ChatCommandError(f"/{command.kind.value} is handled by the REPL loop")


# -- one answer -----------------------------------------------------------------------------------
@dataclass
class Answer:
    content: str = ""
    reasoning: str = ""
    finished: ChatEvent | None = None


def stream_answer(events: Iterator[ChatEvent], console: Console, answer: Answer) -> None:
    """Print events as they arrive, filling `answer` (kept up to date if interrupted)."""
    for event in events:
        if event.kind == "reasoning":
            answer.reasoning += event.text
            console.print(event.text, style="dim", end="", markup=False, soft_wrap=True)
        elif event.kind == "content":
            if answer.reasoning and not answer.content:
                console.print()  # the answer starts on its own line below the thinking
            answer.content += event.text
            console.print(event.text, end="", markup=False, soft_wrap=True)
        elif event.kind == "tool_call" and event.tool_call is not None:
            call = event.tool_call
            console.print(
                f"\n[tool call] {call.name}({call.arguments})", style="cyan", markup=False
            )
        elif event.kind == "finished":
            answer.finished = event
    console.print()


def stats_line(event: ChatEvent) -> str:
    """The dim summary under an answer: sizes, decode speed and why it ended."""
    usage, timings = event.usage, event.timings
    parts = []
    if usage is not None:
        parts.append(f"{usage.prompt_tokens} prompt")
        parts.append(f"{usage.completion_tokens} tokens ({usage.reasoning_tokens} reasoning)")
    tps = timings.predicted_per_second if timings is not None else 0.0
    parts.append(f"{tps:.1f} tok/s" if tps else "n/a tok/s")
    spec = event.stats.speculative if event.stats is not None else None
    if spec and spec.get("rounds"):  # tokens committed per round: what the drafts bought
        committed = spec["rounds"] + spec["accepted_tokens"]
        parts.append(
            f"{committed / spec['rounds']:.2f} tokens/round "
            f"({spec['accepted_tokens']}/{spec['drafted_tokens']} drafts accepted)"
        )
    if event.finish_reason is not None:
        parts.append(event.finish_reason.value)
    return " · ".join(parts)


# -- the command ----------------------------------------------------------------------------------
def chat(
    ctx: typer.Context,
    artifact: Path | None = o.artifact_argument(),
    max_tokens: int = o.opt(
        512, "--max-tokens", help="Output tokens per answer.", metavar="N", min=1
    ),
    max_context: int | None = o.max_context(None),
    temperature: float | None = o.temperature(),
    top_p: float | None = o.top_p(),
    top_k: int | None = o.top_k(),
    min_p: float | None = o.min_p(),
    presence_penalty: float | None = o.presence_penalty(),
    frequency_penalty: float | None = o.frequency_penalty(),
    seed: int | None = o.seed("Sampling seed for every answer."),
    greedy: bool = o.greedy("Always pick the most likely token."),
    no_thinking: bool = o.no_thinking("Start with thinking off."),
    chat_template: Path | None = o.chat_template(),
    dtype: str = o.dtype(),
    kv_dtype: str = o.kv_dtype(),
    decode_tiles: bool = o.decode_tiles(),
    spec: str | None = o.spec(),
    draft_tokens: int | None = o.draft_tokens(),
    lm_head_draft: bool = o.lm_head_draft(),
    device: str = o.device(),
    max_model_len: int | None = o.max_model_len(),
    vision: bool = o.opt(False, "--vision", help="Load the vision tower (for /image)."),
) -> None:
    """Chat with a model in the terminal (reasoning is shown dimmed).

    Type /help in the REPL for its commands. A line ending in a backslash
    continues on the next line; a message that starts with triple quotes
    runs until a line ending in triple quotes.
    """
    max_context = o.merge_alias(ctx, "max_context", max_context, "--max-model-len", max_model_len)
    if dtype not in ("bf16", "fp32"):
        raise UserError("--dtype must be bf16 or fp32")
    speculative = o.spec_options("chat", spec, draft_tokens, lm_head_draft)
    sampling = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "presence_penalty": presence_penalty,
        "frequency_penalty": frequency_penalty,
        "seed": seed,
    }
    options: dict[str, Any] = {
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "device": parse_device(device),
        "greedy": greedy,
        "vision": vision,
        **speculative,
        **({"decode_tiles": True} if decode_tiles else {}),
    }
    if max_context is not None:
        options["max_context"] = max_context
    options.update({k: v for k, v in sampling.items() if v is not None})
    check_sampling(sampling)
    check_engine_options(options)
    check_artifact_path(artifact)
    template = load_template(chat_template) if chat_template is not None else None
    options["device"] = check_device(options["device"])
    check_engine_options(options)  # again with `auto` resolved (--decode-tiles on the CPU)
    path = resolve_artifact(artifact)
    try:
        engine = load_engine(path, options)
    except ValueError as e:
        raise UserError(str(e)) from e
    console = Console(highlight=False)
    try:
        if template is not None:
            from ninfer.chat.template import ChatTemplate

            engine.template = ChatTemplate(template)
        _banner(console, engine, max_tokens, not no_thinking)
        session = ChatSession(enable_thinking=not no_thinking, vision=engine.media is not None)
        repl(engine, console, session, max_tokens)
    finally:
        engine.close()


def _banner(console: Console, engine: Engine, max_tokens: int, thinking: bool) -> None:
    if engine.artifact.metadata.get("random_weights"):
        console.print(
            "RANDOM WEIGHTS: this is a demo model; its output is meaningless.",
            style="bold yellow",
            markup=False,
        )
    options = engine.options
    spec = f" · MTP, {options.num_drafts} drafts a round" if options.spec == "mtp" else ""
    console.print(
        f"ninfer chat · {engine.model_id} · thinking {'on' if thinking else 'off'} · "
        f"max {max_tokens} tokens per answer{spec}",
        style="bold",
        markup=False,
    )
    console.print(HELP, style="dim", markup=False)


def repl(
    engine: Engine,
    console: Console,
    session: ChatSession,
    max_tokens: int,
    read: Callable[[str], str] | None = None,
) -> None:
    """Read, answer, repeat until /exit, Ctrl-D or Ctrl-C at the prompt."""
    from ninfer.chat.template import TemplateError
    from ninfer.engine.errors import ContextLengthExceeded, EngineError
    from ninfer.media.errors import MediaError

    if read is None:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        read = input
    while True:
        try:
            text = read_message(read)
        except (EOFError, KeyboardInterrupt):
            console.print()
            return
        if not text.strip():
            continue
        try:
            command = parse_command(text.strip())
            if command is not None:
                if command.kind == CommandKind.EXIT:
                    return
                console.print(session.apply(command), style="dim", markup=False)
                continue
        except ChatCommandError as e:
            console.print(str(e), style="red", markup=False)
            continue
        events = engine.chat(
            session.messages(text), enable_thinking=session.enable_thinking, max_tokens=max_tokens
        )
        answer = Answer()
        try:
            stream_answer(events, console, answer)
        except KeyboardInterrupt:
            events.close()  # closing the iterator cancels the engine request
            console.print(
                "\n[stopped; this turn is not kept in the history]", style="yellow", markup=False
            )
            continue
        except (EngineError, TemplateError, MediaError) as e:
            hint = " (/reset clears the history)" if isinstance(e, ContextLengthExceeded) else ""
            if isinstance(e, MediaError):
                session.images.clear()  # a bad attachment must not poison every next turn
                if e.code == "vision_disabled":
                    hint = " (start ninfer chat with --vision)"
            console.print(f"error: {e}{hint}", style="red", markup=False)
            continue
        session.record(text, answer.content, answer.reasoning)
        if answer.finished is not None:
            console.print(stats_line(answer.finished), style="dim", markup=False)
