"""MediaError: every way a media item can be refused, with the spec's error code.

Imports nothing from ninfer. The server maps each code to an HTTP 400 (or the dedicated fetch /
timeout status); a media failure is always the client's item, never a 5xx.
"""

from __future__ import annotations

INVALID_MEDIA = "invalid_media"  # undecodable bytes, bad data URI, unsupported content
MEDIA_BUDGET_EXCEEDED = "media_budget_exceeded"  # over a size, pixel, patch or memory budget
MEDIA_FETCH_FAILED = "media_fetch_failed"  # a remote fetch failed or was refused
MEDIA_FETCH_TIMEOUT = "media_fetch_timeout"  # a remote fetch ran past its time limit


class MediaError(ValueError):
    """A media item that cannot be used; `param` names the request field when known."""

    def __init__(self, message: str, *, code: str = INVALID_MEDIA, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param

    def at(self, param: str) -> MediaError:
        """The same error naming the request field it came from (kept if already named)."""
        if self.param is None:
            self.param = param
            self.message = f"{param}: {self.message}"
            self.args = (self.message,)
        return self
