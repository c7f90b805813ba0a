"""`ninfer count-tokens`: the exact prompt token count of a rendered conversation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from ninfer.cli import options as o
from ninfer.cli.checks import load_template, read_user_file
from ninfer.cli.common import resolve_artifact
from ninfer.cli.errors import UserError


def _read_json(path: Path, what: str) -> Any:
    text = read_user_file(path, f"{what} file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(
            f"{path}: {what} file is not valid JSON ({e.msg} at line {e.lineno})"
        ) from e


def _load_messages(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    doc = _read_json(path, "messages")
    tools = None
    if isinstance(doc, dict):
        tools = doc.get("tools")
        doc = doc.get("messages")
    if not isinstance(doc, list) or not all(isinstance(m, dict) for m in doc):
        raise UserError(f"{path}: expected a JSON array of messages or {{messages, tools}}")
    return doc, tools


def _expand_media(
    art: Any, tokenizer: Any, ids: list[int], msgs: list[dict[str, Any]]
) -> list[int]:
    """The ids with each image / video placeholder expanded to its vision tokens, as the engine
    expands them: the media is fetched, decoded and resized (its size sets the count), the
    model is not loaded."""
    import torch

    from ninfer.api import media_preparer
    from ninfer.engine.options import EngineOptions
    from ninfer.media.errors import MediaError
    from ninfer.media.layout import MediaTokens, expand_prompt
    from ninfer.media.sources import collect_media

    try:
        sources = collect_media(msgs)
    except MediaError as e:
        raise UserError(e.message) from e
    if not sources:
        return ids
    if "vision" not in art.components:
        raise UserError(
            f"{sources[0].param}: this artifact has no vision tower, so it takes no images or "
            "videos"
        )
    preparer = media_preparer(art, EngineOptions(), torch.bfloat16)
    try:
        lease = preparer.prepare(sources)
        try:
            tokens = MediaTokens.from_config(art.config.get("model") or {})
            prompt = expand_prompt(ids, lease.items, tokens, tokenizer.encode_text)
        finally:
            lease.release()
    except MediaError as e:
        raise UserError(e.message) from e
    finally:
        preparer.close()
    return list(prompt.token_ids)


def count_tokens(
    artifact: Path | None = o.artifact_argument(),
    text: str | None = o.opt(
        None, "--text", help="Count this text as one user message.", metavar="TEXT"
    ),
    messages: Path | None = o.opt(
        None,
        "--messages",
        help="JSON file: an array of messages or {messages, tools}.",
        metavar="FILE",
    ),
    tools: Path | None = o.opt(
        None, "--tools", help="JSON file with an array of tools.", metavar="FILE"
    ),
    show: bool = o.opt(False, "--show", help="Print the rendered prompt too."),
    no_thinking: bool = o.no_thinking("Render with thinking off."),
    chat_template: Path | None = o.chat_template(),
) -> None:
    """Render the chat template and print the prompt's exact token count (images and videos
    expanded to their vision tokens)."""
    from ninfer.artifact.reader import Artifact
    from ninfer.chat.template import ChatTemplate
    from ninfer.tokenizer import Tokenizer

    if (text is None) == (messages is None):
        raise UserError("give exactly one of --text or --messages")
    if messages is not None:
        msgs, file_tools = _load_messages(messages)
    else:
        msgs, file_tools = [{"role": "user", "content": text}], None
    tool_list = _read_json(tools, "tools") if tools is not None else file_tools
    if tool_list is not None and not isinstance(tool_list, list):
        raise UserError("tools must be a JSON array")
    own_template = load_template(chat_template) if chat_template is not None else None
    kwargs = {"enable_thinking": False} if no_thinking else {}
    with Artifact(resolve_artifact(artifact)) as art:
        source = own_template if own_template is not None else art.chat_template()
        tokenizer = Tokenizer.from_json(art.tokenizer_json)
        template = ChatTemplate(source)
        ids = template.render_ids(tokenizer, msgs, tools=tool_list, **kwargs)
        ids = _expand_media(art, tokenizer, ids, msgs)
    if show:
        typer.echo(template.render(msgs, tools=tool_list, **kwargs), nl=False)
        typer.echo("")
    typer.echo(str(len(ids)))
