"""`--request-log-jsonl FILE`: opening (append mode; bad paths stop startup), the envelope every
flushed line carries, argv redaction and server_start. Event bodies come from their owners
(request_records, stats_log); `schemas/request_log.schema.json` is the published contract the
tests validate against. No sanic import.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
import threading
import time
import uuid
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import IO, Any

SCHEMA_NAME = "ninfer_serve_request_log"
SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("schemas") / "request_log.schema.json"
REDACTED = "<redacted>"
SECRET_FLAGS = ("--api-key",)

log = logging.getLogger("ninfer.server")


class RequestLogError(ValueError):
    """The log file cannot be used; the message names the path and the reason."""


def check_path(path: str | Path, artifact: str | Path | None = None) -> Path:
    """Validate a log path before anything heavy loads; returns it unchanged."""
    path = Path(path)
    flag = "--request-log-jsonl"
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise RequestLogError(f"{flag} {path}: the directory {parent} does not exist")
    if path.is_dir():
        raise RequestLogError(f"{flag} {path}: is a directory, not a file")
    if artifact is not None and path.exists() and os.path.samefile(path, artifact):
        raise RequestLogError(f"{flag} {path}: is the model artifact; choose another file")
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise RequestLogError(f"{flag} {path}: cannot be opened ({e.strerror})") from None
    return path


def redact_argv(argv: list[str] | tuple[str, ...], secret: str | None = None) -> list[str]:
    """argv with every secret flag's value (and any copy of `secret`) replaced by <redacted>."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag in SECRET_FLAGS:
            if eq:
                out.append(f"{flag}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg.replace(secret, REDACTED) if secret else arg)
    return out


class RequestLog:
    """Writes envelopes; a disabled log (`RequestLog(None)`) accepts and drops every event."""

    def __init__(self, file: IO[str] | None, path: Path | None = None) -> None:
        self._file = file
        self.path = path
        self.instance_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._lost = 0

    @classmethod
    def open(cls, path: str | Path, artifact: str | Path | None = None) -> RequestLog:
        path = check_path(path, artifact)
        try:
            file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - lives as long as the server
        except OSError as e:
            raise RequestLogError(
                f"--request-log-jsonl {path}: cannot be opened ({e.strerror})"
            ) from None
        return cls(file, path)

    @property
    def enabled(self) -> bool:
        return self._file is not None

    def envelope(self, event: str, body: dict[str, Any]) -> dict[str, Any]:
        return {
            "schema": SCHEMA_NAME,
            "schema_version": SCHEMA_VERSION,
            "event": event,
            "timestamp_unix_ms": time.time_ns() // 1_000_000,
            "server_instance_id": self.instance_id,
            **body,
        }

    def write(self, event: str, body: dict[str, Any]) -> None:
        if self._file is None:
            return
        line = json.dumps(self.envelope(event, body), ensure_ascii=False, allow_nan=False)
        with self._lock:
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except (OSError, ValueError) as e:  # a full disk must not fail requests
                self._lost += 1
                if self._lost == 1:
                    log.error("request log %s: write failed (%s); events are lost", self.path, e)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return value


def server_start_body(engine: Any, config: Any, argv: list[str] | tuple[str, ...]) -> dict:
    """The server_start record: identity, resolved limits, sampler defaults, redacted argv."""
    opts = engine.options
    meta = engine.artifact.metadata
    cache = getattr(engine, "cache", None)
    stats = engine.stats()
    return {
        "pid": os.getpid(),
        "argv": redact_argv(argv, config.api_key),
        "versions": {
            "ninfer": _version(),
            "python": platform.python_version(),
            "torch": _module_version("torch"),
            "sanic": _module_version("sanic"),
        },
        "artifact": {
            "path": str(engine.artifact.path),
            "name": str(meta.get("name") or ""),
            "architecture": str(meta.get("architecture") or ""),
            "random_weights": bool(meta.get("random_weights", False)),
        },
        "model_id": config.model_id or engine.model_id,
        "engine": {k: _plain(v) for k, v in asdict(opts).items()},
        "capacity": {
            "kv_pages": stats.kv_capacity_pages,
            "page_size": opts.page_size,
            "state_slots": stats.state_capacity_slots,
            "max_concurrency": opts.max_concurrency,
            "max_pending_requests": opts.max_pending_requests,
            "max_context": opts.max_context,
            "host_context_bytes": stats.host_context_capacity_bytes,
        },
        "cuda_graphs": str(getattr(engine, "graph_status", "off")),
        "cache_dtype": str(getattr(cache, "dtype", opts.dtype)),
        "sampling_presets": {k: _plain(v) for k, v in engine.presets.items()},
        "process_sampling_overrides": dict(opts.process_sampling),
        "greedy": bool(opts.greedy),
        "thinking": {
            "default_enabled": not config.no_thinking,
            "preserve_default": bool(config.preserve_thinking),
            "default_budget": config.default_thinking_budget,
        },
        "server": {
            "host": config.host,
            "port": config.port,
            "api_key_required": config.api_key is not None,
            "cors": bool(config.cors),
            "max_request_mib": config.max_request_mib,
            "default_max_tokens": config.default_max_tokens,
            "keepalive_seconds": config.keepalive_s,
            "delivery_timeout_seconds": config.delivery_timeout_s,
            "log_stats_interval_ms": config.log_stats_interval_ms,
            "response_store_max_records": config.response_store_max_records,
            "response_store_max_mib": config.response_store_max_mib,
        },
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ninfer")
    except PackageNotFoundError:
        return "unknown"


def _module_version(name: str) -> str | None:
    module = sys.modules.get(name)
    if module is None:
        return None
    return str(getattr(module, "__version__", "")) or None
