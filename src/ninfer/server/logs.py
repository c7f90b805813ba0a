"""Operational stderr records: `YYYY-MM-DD HH:MM:SS.mmm LEVEL message`, one line each.

Owns the `ninfer` logger tree's handler, quiets Sanic's own loggers so redirected stderr holds
only these records (no banners, no colour codes), and the level policy for request outcomes:
client mistakes INFO, capacity WARNING, server faults ERROR, never a traceback above DEBUG.
Records never carry prompts, generated text, request bodies or credentials: counts and codes only.
"""

from __future__ import annotations

import logging
import sys

LEVELS = {
    "trace": 5,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
    "off": logging.CRITICAL + 10,
}
FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
SANIC_LOGGERS = ("sanic.root", "sanic.error", "sanic.access", "sanic.server", "sanic.websockets")

log = logging.getLogger("ninfer.server")
CAPACITY_STATUSES = frozenset({429, 503, 504, 529})  # overload, queue timeout, unavailable


def level_for_status(status: int) -> int:
    """INFO for success and client errors, WARNING for capacity, ERROR for server faults."""
    if status in CAPACITY_STATUSES:
        return logging.WARNING
    return logging.ERROR if status >= 500 else logging.INFO


def log_http_error(request_id: str, method: str, path: str, status: int, code: str | None) -> None:
    """One record for an error answered outside a generation lifecycle (no traceback)."""
    log.log(
        level_for_status(status),
        "request %s %s %s status=%d code=%s",
        request_id, method, path, status, code,
    )  # fmt: skip


def seconds(value: float | None) -> str:
    """A readable duration: `850ms`, `12.3s`, `-` when unknown."""
    if value is None:
        return "-"
    return f"{value * 1000:.0f}ms" if value < 10 else f"{value:.1f}s"


def configure_logging(level: str = "info") -> None:
    """Install the record format on stderr for ninfer and Sanic loggers at `level`."""
    if level not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, got {level!r}")
    logging.addLevelName(LEVELS["trace"], "TRACE")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    root = logging.getLogger("ninfer")
    root.handlers[:] = [handler]
    root.setLevel(LEVELS[level])
    root.propagate = False
    for name in SANIC_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        # Sanic's startup chatter is debug detail here; its errors still show.
        logger.setLevel(max(LEVELS[level], logging.WARNING))
        logger.propagate = False
