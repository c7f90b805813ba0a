"""SSE framing: compact UTF-8 `data:` frames, the [DONE] sentinel and the keep-alive comment."""

from __future__ import annotations

import json

from ninfer.server.sse import DONE, KEEPALIVE, data_frame


def test_frames() -> None:
    frame = data_frame({"a": "é", "b": [1]})
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    assert json.loads(frame[6:]) == {"a": "é", "b": [1]}
    assert "é" in frame.decode()  # not \u-escaped
    assert DONE == b"data: [DONE]\n\n"
    assert KEEPALIVE.startswith(b":") and KEEPALIVE.endswith(b"\n\n")  # an SSE comment
