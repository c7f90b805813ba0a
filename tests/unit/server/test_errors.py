"""Engine and template failures map to the spec's HTTP statuses and codes."""

from __future__ import annotations

import pytest

from ninfer.chat.template import TemplateError
from ninfer.engine.errors import (
    ContextLengthExceeded,
    EngineClosed,
    EngineFailed,
    InvalidRequest,
    QueueTimeout,
    ServerOverloaded,
)
from ninfer.protocol.errors import ProtocolError
from ninfer.server.errors import to_protocol_error


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (ServerOverloaded("full"), 429, "server_overloaded"),
        (QueueTimeout("late"), 503, "request_queue_timeout"),
        (ContextLengthExceeded(600, 512), 400, "context_length_exceeded"),
        (InvalidRequest("bad"), 400, "invalid_request"),
        (EngineClosed("closed"), 503, "engine_unavailable"),
        (EngineFailed("cuda says secret prompt text"), 500, "engine_failure"),
        (TemplateError("no user message"), 400, "invalid_prompt"),
        (RuntimeError("secret prompt text"), 500, "internal_error"),
    ],
)
def test_status_and_code(exc: Exception, status: int, code: str) -> None:
    error = to_protocol_error(exc)
    assert (error.status, error.code) == (status, code)
    if status >= 500:
        assert "secret" not in error.message  # internal text never reaches the client


def test_context_error_keeps_both_counts() -> None:
    message = to_protocol_error(ContextLengthExceeded(600, 512)).message
    assert "600" in message and "512" in message


def test_protocol_errors_pass_through() -> None:
    err = ProtocolError("x", status=404, code="model_not_found")
    assert to_protocol_error(err) is err
