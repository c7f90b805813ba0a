"""Maps engine, media and template failures to the protocol's HTTP errors (the spec's table).

The one place that knows both `engine.errors` codes and HTTP statuses. Unknown exceptions become a
500 `internal_error` with a fixed message: internal invariant failures are never relabelled as
client input errors, and their text (which may quote a prompt) never reaches the client.
"""

from __future__ import annotations

from ninfer.chat.template import TemplateError
from ninfer.engine.errors import EngineError
from ninfer.media.errors import MediaError
from ninfer.protocol.errors import INVALID_REQUEST, RATE_LIMIT, SERVER, ProtocolError

# engine error code -> (HTTP status, OpenAI error type)
ENGINE_STATUS = {
    "server_overloaded": (429, RATE_LIMIT),
    "request_queue_timeout": (503, SERVER),
    "context_length_exceeded": (400, INVALID_REQUEST),
    "invalid_request": (400, INVALID_REQUEST),
    "thinking_budget_capacity_insufficient": (400, INVALID_REQUEST),
    "engine_unavailable": (503, SERVER),
    "engine_failure": (500, SERVER),
}


def to_protocol_error(exc: BaseException) -> ProtocolError:
    if isinstance(exc, ProtocolError):
        return exc
    if isinstance(exc, EngineError):
        status, kind = ENGINE_STATUS.get(exc.code, (500, SERVER))
        message = str(exc) if status < 500 or exc.code != "engine_failure" else "engine failure"
        return ProtocolError(message or exc.code, status=status, code=exc.code, type=kind)
    if isinstance(exc, MediaError):  # always the client's item: 400, never a 5xx
        return ProtocolError(exc.message, code=exc.code, param=exc.param)
    if isinstance(exc, TemplateError):
        return ProtocolError(f"the prompt could not be rendered: {exc}", code="invalid_prompt")
    return ProtocolError("internal server error", status=500, code="internal_error", type=SERVER)
