"""`serve(...)`: load the Engine, build the app, and run Sanic in this process's main thread.

Sanic must own the main thread (it did not answer when started from another thread); the engine's
worker is the extra thread. Startup, readiness and shutdown are operational stderr records; the
`--request-log-jsonl` file is opened before the model loads, so a bad path fails at once.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ninfer.server.config import ServerConfig
from ninfer.server.logs import configure_logging
from ninfer.server.request_log import RequestLog

log = logging.getLogger("ninfer.server")


def serve(
    artifact: Path,
    config: ServerConfig,
    engine_options: dict[str, Any],
    *,
    log_level: str = "info",
    chat_template: Path | None = None,
    sock: socket.socket | None = None,
    load: Callable[[Path, dict[str, Any]], Any] | None = None,
) -> None:
    """Blocks until SIGINT/SIGTERM; the engine is closed on the way out.

    `sock` is an already listening socket (the CLI binds it before loading, so a busy port fails
    fast); `load` replaces `Engine.load` (the CLI's loader reports progress).
    """
    from ninfer.api import Engine
    from ninfer.chat.template import ChatTemplate

    configure_logging(log_level)
    request_log = None
    if config.request_log_jsonl is not None:
        request_log = RequestLog.open(config.request_log_jsonl, artifact)
    log.info("loading %s", artifact)
    t0 = time.monotonic()
    if load is None:
        engine = Engine.load(artifact, **engine_options)
    else:
        engine = load(artifact, engine_options)
    try:
        if chat_template is not None:
            engine.template = ChatTemplate(chat_template.read_text(encoding="utf-8"))
        opts = engine.options
        kv_tokens = engine.parts.num_pages * opts.page_size
        log.info(
            "engine ready in %.1fs: model=%s device=%s dtype=%s kv_dtype=%s max_context=%d "
            "kv_capacity=%d max_concurrency=%d max_pending=%d%s",
            time.monotonic() - t0, engine.model_id, opts.device, opts.dtype, opts.kv_dtype,
            opts.max_context, kv_tokens, opts.max_concurrency, opts.max_pending_requests,
            _option_words(opts),
        )  # fmt: skip
        if engine.artifact.metadata.get("random_weights"):
            log.warning("%s has RANDOM weights: its output is meaningless", engine.model_id)
        run_server(engine, config, request_log, sock=sock)
    finally:
        engine.close()
        log.info("shutdown complete")


def _option_words(opts: Any) -> str:
    """The ready line's speculative and decode-tiles part: empty without --spec and
    --decode-tiles, so plain logs stay as they were."""
    words = ""
    if opts.spec is not None:
        words = f" spec={opts.spec} draft_tokens={opts.num_drafts}"
        words += " lm_head_draft" if opts.lm_head_draft else ""
    return words + (" decode_tiles" if opts.decode_tiles else "")


def run_server(
    engine: Any,
    config: ServerConfig,
    request_log: RequestLog | None = None,
    *,
    sock: socket.socket | None = None,
) -> None:
    """Serve an already loaded engine until SIGINT/SIGTERM (the caller closes the engine)."""
    from ninfer.server.app import create_app

    app = create_app(engine, config, request_log=request_log)
    where: dict[str, Any] = {"sock": sock} if sock else {"host": config.host, "port": config.port}
    app.run(
        **where,
        single_process=True,
        motd=False,
        access_log=False,
        debug=False,
    )
