"""OpenAI-shaped protocol errors: one typed exception carrying HTTP status, type, code and param.

Imports only the standard library (no sanic, no engine): parsers raise `ProtocolError`, and the
server renders `.body()` as `{"error": {"message", "type", "param", "code"}}`. Messages are one line
and name the offending field, so a client can fix its request without reading server logs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
RATE_LIMIT = "rate_limit_error"
SERVER = "server_error"


class ProtocolError(Exception):
    """A request the server answers with an error body instead of running it."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        code: str | None = "invalid_value",
        param: str | None = None,
        type: str = INVALID_REQUEST,
    ) -> None:
        super().__init__(" ".join(message.split()))
        self.parts: list[ProtocolError] = []  # the single errors a combined error lists
        self.status = status
        self.code = code
        self.param = param
        self.type = type

    @property
    def message(self) -> str:
        return str(self)

    def body(self) -> dict[str, Any]:
        return error_body(self.message, type=self.type, code=self.code, param=self.param)


def error_body(
    message: str, *, type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def invalid(param: str, message: str, code: str = "invalid_value") -> ProtocolError:
    """A malformed value: wrong type, out of range, or structurally impossible."""
    return ProtocolError(f"{param}: {message}", code=code, param=param)


def invalid_type(param: str, expected: str, value: Any) -> ProtocolError:
    return invalid(param, f"must be {expected}, got {_kind(value)}", code="invalid_type")


def unsupported(param: str, message: str, code: str = "unsupported_parameter") -> ProtocolError:
    """A well-formed request for behaviour the engine cannot provide; names the lost guarantee."""
    return ProtocolError(f"{param}: {message}", code=code, param=param)


def missing_or_type(
    obj: Mapping[str, Any], name: str, expected: str, *, prefix: str = ""
) -> ProtocolError:
    """The error for a required field that is absent (missing) or present with the wrong type."""
    if obj.get(name) is None:
        return invalid(prefix + name, "is required", code="missing_required_parameter")
    return invalid_type(prefix + name, expected, obj[name])


def opt_bool(obj: Mapping[str, Any], name: str, prefix: str = "") -> bool | None:
    """An optional boolean field: its value, None when absent, an error for any other type."""
    value = obj.get(name)
    if value is not None and not isinstance(value, bool):
        raise invalid_type(prefix + name, "a boolean", value)
    return value


def conflicting_template_option(message: str) -> ProtocolError:
    """Typed fields and chat_template_kwargs disagree about one template option."""
    return ProtocolError(message, code="conflicting_template_option", param="chat_template_kwargs")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


class ErrorCollector:
    """Gathers the errors of independent checks so one 400 names every problem at once.

    `with errors.check(): ...` records a ProtocolError instead of raising it; `raise_any()`
    raises the single error unchanged, or one error whose message lists all of them (status,
    code and param of the first, so clients that read only those still see a real field).
    """

    def __init__(self) -> None:
        self.errors: list[ProtocolError] = []

    @contextlib.contextmanager
    def check(self) -> Iterator[None]:
        try:
            yield
        except ProtocolError as error:
            self.errors += getattr(error, "parts", None) or [error]  # nested collectors flatten

    def raise_any(self) -> None:
        if not self.errors:
            return
        first = self.errors[0]
        if len(self.errors) == 1:
            raise first
        listed = "; ".join(error.message for error in self.errors)
        combined = ProtocolError(
            f"{len(self.errors)} problems: {listed}",
            status=first.status,
            code=first.code,
            param=first.param,
            type=first.type,
        )
        combined.parts = list(self.errors)
        raise combined
