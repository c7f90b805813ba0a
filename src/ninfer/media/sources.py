"""Which media a conversation holds, in the order the chat template renders their placeholders.

Imports the standard library only. A template message part is media exactly when the template
treats it so ('image' / 'image_url' key or type, then 'video' / 'video_url'); its source is a
data URI or an http(s) URL string. Decoding a data URI lives here too (base64, size-checked
before decoding so a huge payload is refused without allocating it).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ninfer.media.errors import MEDIA_BUDGET_EXCEEDED, MediaError

Kind = Literal["image", "video"]
_DATA_URI = re.compile(r"^data:(?P<header>[^,]*),", re.I)


@dataclass(frozen=True)
class MediaSource:
    kind: Kind
    url: str  # data URI or http(s) URL
    param: str  # where it came from, for error messages ("messages[0].content[1]")


def _part_kind(part: Mapping[str, Any]) -> Kind | None:
    if "image" in part or "image_url" in part or part.get("type") == "image":
        return "image"
    if "video" in part or part.get("type") == "video":
        return "video"
    if "text" in part:
        return None
    if "video_url" in part or part.get("type") == "video_url":
        return "video"
    return None


def _url_of(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("url"), str):
        return value["url"]
    return None


def part_source(part: Mapping[str, Any], param: str) -> MediaSource | None:
    """The media source of one template content part, or None for a text part. A part the
    protocol layer made names its wire field (`source_param`); that name wins over `param`."""
    kind = _part_kind(part)
    if kind is None:
        return None
    param = str(part.get("source_param") or param)
    keys = ("image", "image_url") if kind == "image" else ("video", "video_url")
    for key in keys:
        url = _url_of(part.get(key))
        if url is not None:
            return MediaSource(kind, url, param)
    raise MediaError(f"{param}: the {kind} part has no URL", param=param)


def collect_media(messages: Iterable[Mapping[str, Any]]) -> list[MediaSource]:
    """Every media part of `messages`, in message and part order."""
    out = []
    for i, message in enumerate(messages):
        content = message.get("content")
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, Mapping):
                    src = part_source(part, f"messages[{i}].content[{j}]")
                    if src is not None:
                        out.append(src)
    return out


def decode_data_uri(url: str, max_bytes: int) -> bytes:
    """The bytes of a `data:[mime][;base64],payload` URI (base64 only: media is binary)."""
    m = _DATA_URI.match(url)
    if m is None:
        raise MediaError("malformed data URI")
    if not m.group("header").lower().endswith(";base64"):
        raise MediaError("data URIs of media must be base64-encoded")
    payload = url[m.end() :]
    if len(payload) // 4 * 3 > max_bytes:
        raise MediaError(
            f"data URI payload exceeds the media size limit of {max_bytes} bytes",
            code=MEDIA_BUDGET_EXCEEDED,
        )
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise MediaError(f"data URI has invalid base64 ({e})") from e


def is_http_url(url: str) -> bool:
    return url.lower().startswith(("http://", "https://"))
