"""Operational stderr records: `YYYY-MM-DD HH:MM:SS.mmm LEVEL message`, one line each.

Owns the `ninfer` logger tree's handler and quiets Sanic's own loggers so redirected stderr holds
only these records (no banners, no colour codes). Records never carry prompts, generated text,
request bodies or credentials: callers pass counts and codes only.
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
