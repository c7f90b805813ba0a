"""Wire media parts -> the chat template's media parts, shared by the three API codecs.

Imports only protocol.errors (no torch, no media package): this checks the shape of a media
reference (a data URI or an http(s) URL, detail omitted or auto) and writes the template part
`{"type": "image", "image": url}` / `{"type": "video", "video": url}`. Fetching and decoding
happen later, in the engine's media preparation, whose errors name the same field.
"""

from __future__ import annotations

from typing import Any

from ninfer.protocol.errors import invalid, invalid_type, unsupported

PARAM_KEY = "source_param"  # read by ninfer.media.sources (the same spelling, kept in sync)


def media_url(param: str, url: Any) -> str:
    """A media reference the server can acquire: a data URI or an http(s) URL."""
    if not isinstance(url, str) or not url:
        raise invalid_type(param, "a non-empty URL string", url)
    lowered = url[:8].lower()
    if not (lowered.startswith(("http://", "https://")) or lowered.startswith("data:")):
        raise invalid(param, "must be an http(s) URL or a data URI", code="invalid_media")
    return url


def check_detail(param: str, detail: Any) -> None:
    if detail not in (None, "auto"):
        raise unsupported(
            param, "only detail 'auto' is supported; images are always processed at full detail"
        )


def openai_url_part(param: str, kind: str, value: Any) -> dict[str, str]:
    """An OpenAI `image_url` / `video_url` value: {"url", "detail"?} or a plain URL string."""
    if isinstance(value, dict):
        check_detail(f"{param}.detail", value.get("detail"))
        url = media_url(f"{param}.url", value.get("url"))
    else:
        url = media_url(param, value)
    return template_part(kind, url, param)


def template_part(kind: str, url: str, param: str | None = None) -> dict[str, str]:
    """`param` names the wire field, so media errors found later point at what the client sent
    (the template ignores the extra key)."""
    part = {"type": kind, kind: url}
    if param is not None:
        part[PARAM_KEY] = param
    return part


def text_part(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


def text_length(parts: list[dict[str, str]]) -> int:
    """Characters of text in `parts` so far: where a cache breakpoint after them falls in the
    joined text (markers inside media content are not placed: see chat/cache_hints.py)."""
    return sum(len(p["text"]) for p in parts if p["type"] == "text")


def joined(parts: list[dict[str, str]]) -> str | list[dict[str, str]]:
    """Text-only content as one string (the template's plain form); with media, the part list."""
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts
