"""Option declarations shared by several commands, so one flag reads and checks the same everywhere.

Every option names a short metavar (N, F, FILE, ...) and flags name none, so `--help` shows no
`<int>` / `<bool>` type noise. Options that are parsed only to be refused (not built yet) are
declared `hidden`: absent from help, still answered with a message naming them.
"""

from __future__ import annotations

from typing import Any

import typer

from ninfer.cli.device import DEVICE_FORMS
from ninfer.cli.errors import UserError


def opt(default: Any, *names: str, help: str, metavar: str | None = None, **kw: Any) -> Any:
    """An option with a clean help line: a metavar for values, none for flags."""
    if isinstance(default, bool):
        metavar = ""
        kw.setdefault("show_default", False)
    else:
        kw.setdefault("show_default", default is not None)
    return typer.Option(default, *names, help=help, metavar=metavar, **kw)


def hidden(default: Any, *names: str) -> Any:
    """An option that is not built yet: parsed so that it can be refused by name, never shown."""
    return typer.Option(default, *names, hidden=True)


def artifact_argument() -> Any:
    return typer.Argument(
        None, help="Artifact file (.ninfer); the demo when omitted.", metavar="ARTIFACT"
    )


def device() -> Any:
    return opt(
        "auto",
        "--device",
        help=f"Where to run: {DEVICE_FORMS} (auto: the first GPU when present, else the CPU).",
        metavar="DEVICE",
    )


def dtype() -> Any:
    return opt("bf16", "--dtype", help="Compute and KV dtype: bf16 or fp32.", metavar="bf16|fp32")


def kv_dtype() -> Any:
    return opt(
        "bf16",
        "--kv-dtype",
        help="KV-cache storage: bf16 (the compute dtype), int8, fp8, nvfp4 or k8v4 (fp8 keys, "
        "nvfp4 values); quantized KV fits more tokens per GiB.",
        metavar="bf16|int8|fp8|nvfp4|k8v4",
    )


def decode_tiles() -> Any:
    return opt(
        False,
        "--decode-tiles",
        help="Keep tile-major copies of the weights the decode GEMVs read (CUDA): fp8 decode "
        "and MTP rounds ~2 % faster, the fp8 projections' memory twice over (docs/kernels.md).",
    )


def spec() -> Any:
    return opt(
        None,
        "--spec",
        help="Speculative decoding backend: mtp (the artifact's MTP head).",
        metavar="mtp",
    )


def draft_tokens() -> Any:
    return opt(
        None,
        "--draft-tokens",
        help="Drafts per speculative round, 1..5 (default 3; needs --spec).",
        metavar="N",
    )


def lm_head_draft() -> Any:
    return opt(
        False, "--lm-head-draft", help="Drafts read a 4-bit shortlist lm_head (needs --spec)."
    )


def spec_options(
    command: str, spec: str | None, draft_tokens: int | None, lm_head_draft: bool
) -> dict[str, Any]:
    """The engine options of `--spec mtp [--draft-tokens K] [--lm-head-draft]`, checked."""
    if spec is not None and spec != "mtp":
        raise UserError(f"--spec {spec} is not supported yet in this version of ninfer {command}")
    if draft_tokens is not None and spec is None:
        raise UserError("--draft-tokens needs --spec mtp")
    if lm_head_draft and spec is None:
        raise UserError("--lm-head-draft needs --spec mtp")
    return {
        **({"spec": spec, "draft_tokens": draft_tokens} if spec is not None else {}),
        **({"lm_head_draft": True} if lm_head_draft else {}),
    }


def alias(name: str, **kw: Any) -> Any:
    """Another spelling of an option (vLLM's), hidden from help; see `merge_alias`."""
    return typer.Option(None, name, hidden=True, **kw)


def merge_alias(
    ctx: typer.Context, param: str, value: Any, alias_name: str, alias_value: Any
) -> Any:
    """The option's value whether it was given by its own name or by its alias.

    Both given with different values is refused rather than one silently winning.
    """
    if alias_value is None:
        return value
    source = ctx.get_parameter_source(param)
    if getattr(source, "name", "") == "COMMANDLINE" and value != alias_value:
        flag = "--" + param.replace("_", "-")
        raise UserError(f"{alias_name} {alias_value} conflicts with {flag} {value}")
    return alias_value


def max_context(default: int | None) -> Any:
    return opt(
        default,
        "--max-context",
        help="Context ceiling of each sequence, in tokens"
        + (", engine default when omitted" if default is None else "")
        + " (also --max-model-len).",
        metavar="N",
        min=2,
    )


def max_model_len() -> Any:
    return alias("--max-model-len", min=2)


def chat_template() -> Any:
    return opt(
        None,
        "--chat-template",
        help="Render with this Jinja template file instead of the artifact's.",
        metavar="FILE",
    )


def no_thinking(help: str) -> Any:
    return opt(False, "--no-thinking", help=help)


# -- sampling: process-level overrides of the artifact's presets (the request may override) ----
def temperature() -> Any:
    return opt(None, "--temperature", help="Temperature override.", metavar="F", min=0.0, max=2.0)


def top_p() -> Any:
    return opt(None, "--top-p", help="Top-p override.", metavar="F", min=0.0, max=1.0)


def top_k() -> Any:
    return opt(
        None, "--top-k", help="Top-k override (0..20; 0 means 20).", metavar="N", min=0, max=20
    )


def min_p() -> Any:
    return opt(None, "--min-p", help="Min-p override.", metavar="F", min=0.0, max=1.0)


def presence_penalty() -> Any:
    return opt(
        None,
        "--presence-penalty",
        help="Presence penalty override.",
        metavar="F",
        min=-2.0,
        max=2.0,
    )


def frequency_penalty() -> Any:
    return opt(
        None,
        "--frequency-penalty",
        help="Frequency penalty override.",
        metavar="F",
        min=-2.0,
        max=2.0,
    )


def seed(help: str) -> Any:
    return opt(None, "--seed", help=help, metavar="N")


def greedy(help: str) -> Any:
    return opt(False, "--greedy", help=help)
