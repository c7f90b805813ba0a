"""Server-sent-event framing shared by the streaming endpoints.

No sanic import: the request lifecycle writes the bytes. The idle heartbeat (`KEEPALIVE`, an SSE
comment clients ignore) is timed by the lifecycle from its last write, so engine events that
produce no frame (prefill progress) do not hold it back.
"""

from __future__ import annotations

import json
from typing import Any

DONE = b"data: [DONE]\n\n"
PREFIX_CACHE_HEADER = "x-ninfer-prefix-cache"  # every generation response: hit or why a miss
KEEPALIVE = b": keep-alive\n\n"


def data_frame(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
