"""`create_app(engine, config)`: the Sanic application with routes, auth, CORS and error bodies.

Owns the cross-cutting HTTP rules: every response carries `x-request-id` (`request-id` on the
Anthropic paths); errors (including Sanic's own 404/405/413) are OpenAI-shaped, Anthropic-shaped
on the Anthropic paths; `--api-key` guards all but /health and preflight,
compared in constant time; `--cors` adds permissive headers. Routes live in their own modules;
generation requests run through one `Lifecycle` each (server/lifecycle.py), and the observability
pieces (metrics, JSONL log, throughput records, shutdown drain) are wired here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import socket
import uuid

from sanic import Request, Sanic, response
from sanic.exceptions import SanicException
from sanic.response import HTTPResponse

from ninfer.api import Engine
from ninfer.protocol.anthropic_render import error_body as anthropic_error_body
from ninfer.protocol.errors import AUTHENTICATION, INVALID_REQUEST, ProtocolError
from ninfer.server.anthropic_routes import AnthropicRoutes, anthropic_error, is_anthropic_path
from ninfer.server.config import ServerConfig
from ninfer.server.errors import to_protocol_error
from ninfer.server.lifecycle import Observability
from ninfer.server.logs import log_http_error
from ninfer.server.metrics import (
    CONTENT_TYPE,
    MetricsCollector,
    ServerMetrics,
    make_registry,
    render,
)
from ninfer.server.openai_routes import OpenAIRoutes
from ninfer.server.request_log import RequestLog, server_start_body
from ninfer.server.responses_routes import ResponsesRoutes
from ninfer.server.stats_log import ThroughputReporter

log = logging.getLogger("ninfer.server")
TCP_USER_TIMEOUT_MS = 15000
# the shutdown drain ends what is still in flight this long before Sanic's graceful timeout
# (SANIC_GRACEFUL_SHUTDOWN_TIMEOUT, 15 s by default) would cut the connections
DRAIN_MARGIN_S = 2.0
OPEN_PATHS = frozenset({"/health"})
KNOWN_PATHS = frozenset(
    {
        "/health",
        "/metrics",
        "/v1/models",
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/responses",
        "/v1/responses/input_tokens",
        "/v1/responses/compact",
    }
)
# Endpoints of the OpenAI and Anthropic APIs (and peers' extensions) that ninfer does not build:
# a 404 naming what is missing and where to go instead, not a bare "no such endpoint".
SERVED = "it serves /v1/chat/completions, /v1/responses and /v1/messages"
UNBUILT_ENDPOINTS = {
    "/v1/completions": "legacy text completions are not supported; send messages to "
    "/v1/chat/completions (a raw prompt: the library's Engine.generate)",
    "/v1/embeddings": "embeddings are not supported: ninfer serves a generative model",
    "/v1/messages/batches": "Anthropic Message Batches are not supported; send each request "
    "to /v1/messages",
    "/v1/complete": "Anthropic's legacy Text Completions are not supported; use /v1/messages",
    "/v1/batches": f"batch jobs are not supported; {SERVED}",
    "/v1/files": f"file storage is not supported; {SERVED}",
    "/v1/conversations": "Conversations are not supported; chain Responses with "
    "previous_response_id",
    "/v1/chat/completions/": "stored Chat Completions are not supported (store is refused)",
    "/tokenize": "tokenize is not an endpoint here; count prompt tokens with "
    "/v1/responses/input_tokens or /v1/messages/count_tokens",
}
SANIC_CODES = {
    400: "invalid_request",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "request_too_large",
}


def create_app(
    engine: Engine,
    config: ServerConfig,
    name: str = "ninfer",
    request_log: RequestLog | None = None,
) -> Sanic:
    """`request_log`: an opened `--request-log-jsonl` (closed with the app); None: disabled."""
    app = Sanic(name, configure_logging=False)
    app.config.REQUEST_MAX_SIZE = config.max_request_bytes
    # Generation can outlast Sanic's defaults; the engine's own deadlines govern instead.
    app.config.RESPONSE_TIMEOUT = 24 * 3600
    app.config.REQUEST_TIMEOUT = 600
    app.config.KEEP_ALIVE_TIMEOUT = 75
    app.config.NOISY_EXCEPTIONS = False
    request_log = request_log or RequestLog(None)
    server_metrics = ServerMetrics()
    hub = Observability(engine, config, request_log, server_metrics)
    app.ctx.hub = hub
    routes = OpenAIRoutes(engine, config, hub)
    app.ctx.routes = routes
    registry = make_registry(MetricsCollector(engine, server_metrics, routes.model_id))

    async def metrics(request: Request) -> HTTPResponse:
        return response.raw(render(registry), content_type=CONTENT_TYPE)

    app.add_route(routes.health, "/health", methods=["GET"])
    app.add_route(metrics, "/metrics", methods=["GET"])
    app.add_route(routes.list_models, "/v1/models", methods=["GET"])
    app.add_route(routes.get_model, "/v1/models/<model_id:path>", methods=["GET"])
    app.add_route(routes.chat_completions, "/v1/chat/completions", methods=["POST"])
    anthropic = AnthropicRoutes(engine, config, hub)
    app.add_route(anthropic.messages, "/v1/messages", methods=["POST"])
    app.add_route(anthropic.count_tokens, "/v1/messages/count_tokens", methods=["POST"])
    if config.default_thinking_budget is not None:  # every protocol's chat requests inherit it
        engine.default_thinking_budget = config.default_thinking_budget
    if request_log.enabled:  # pause / restore boundaries become request_scheduling records
        engine.scheduling_events = True
    responses = ResponsesRoutes(engine, config, hub)
    app.ctx.responses = responses
    app.add_route(responses.create, "/v1/responses", methods=["POST"])
    app.add_route(responses.input_tokens, "/v1/responses/input_tokens", methods=["POST"])
    app.add_route(responses.compact, "/v1/responses/compact", methods=["POST"])
    app.add_route(responses.retrieve, "/v1/responses/<response_id>", methods=["GET"])
    app.add_route(responses.delete, "/v1/responses/<response_id>", methods=["DELETE"])
    app.add_route(responses.input_items, "/v1/responses/<response_id>/input_items", methods=["GET"])
    app.add_route(responses.cancel, "/v1/responses/<response_id>/cancel", methods=["POST"])

    async def preflight(request: Request, **path: str) -> HTTPResponse:
        return response.empty(status=204)

    # Preflight is answered on every path (a route per known path: Sanic matches paths first).
    for i, path in enumerate([*sorted(KNOWN_PATHS), "/v1/models/<model_id:path>", "/<path:path>"]):
        app.add_route(preflight, path, methods=["OPTIONS"], name=f"preflight_{i}")

    @app.on_request
    async def authenticate(request: Request) -> None:
        request.ctx.request_id = _new_request_id()
        _tune_connection(request)
        if config.api_key is None or request.method == "OPTIONS" or request.path in OPEN_PATHS:
            return
        if not _key_matches(request, config.api_key):
            raise ProtocolError(
                "a valid API key is required (Authorization: Bearer KEY or x-api-key: KEY)",
                status=401,
                code="invalid_api_key",
                type=AUTHENTICATION,
            )

    @app.on_response
    async def decorate(request: Request, resp: HTTPResponse) -> None:
        # Anthropic endpoints use their own `request-id` contract; the rest is OpenAI's.
        id_header = "request-id" if is_anthropic_path(request.path) else "x-request-id"
        resp.headers[id_header] = _request_id(request)
        if config.cors:
            resp.headers["access-control-allow-origin"] = request.headers.get("origin", "*")
            resp.headers["vary"] = "origin"
            resp.headers["access-control-allow-methods"] = "GET, POST, DELETE, OPTIONS"
            resp.headers["access-control-allow-headers"] = request.headers.get(
                "access-control-request-headers", "*"
            )
            resp.headers["access-control-expose-headers"] = id_header
            resp.headers["access-control-max-age"] = "600"

    @app.exception(Exception)
    async def on_error(request: Request, exc: Exception) -> HTTPResponse:
        try:
            return _error_response(request, exc)
        except Exception as inner:  # never Sanic's plain-text "error while handling an error"
            log.error("request %s: error rendering failed: %s", _request_id(request),
                      type(inner).__name__)  # fmt: skip
            fallback = ProtocolError(
                "internal server error", status=500, code="internal_error", type="server_error"
            )
            return response.json(fallback.body(), status=500)

    @app.after_server_start
    async def ready(app: Sanic) -> None:
        request_log.write("server_start", server_start_body(engine, config, config.argv))
        if config.log_stats_interval_ms > 0:
            reporter = ThroughputReporter(engine.stats, config.log_stats_interval_ms, request_log)
            app.ctx.reporter = asyncio.get_running_loop().create_task(reporter.run())
        log.info("ready: serving %r at http://%s:%d", routes.model_id, config.host, config.port)

    @app.before_server_stop
    async def stopping(app: Sanic) -> None:
        log.info("shutting down")
        # the drain ends what is left a little before Sanic's grace would cut the connections
        hub.start_drain(float(app.config.GRACEFUL_SHUTDOWN_TIMEOUT) - DRAIN_MARGIN_S)

    @app.after_server_stop
    async def stopped(app: Sanic) -> None:
        reporter = getattr(app.ctx, "reporter", None)
        if reporter is not None:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        await hub.finish_drain()
        request_log.close()

    return app


def _error_response(request: Request, exc: Exception) -> HTTPResponse:
    anthropic = is_anthropic_path(request.path)
    if isinstance(exc, SanicException):
        error = _sanic_error(exc, path=request.path)
    else:
        error = anthropic_error(exc) if anthropic else to_protocol_error(exc)
    if getattr(request.ctx, "outcome_logged", False):
        pass  # a generation lifecycle already wrote this request's record
    elif error.status >= 500 or request.path.startswith("/v1/"):
        log_http_error(_request_id(request), request.method, request.path, error.status, error.code)
        if error.status >= 500:
            log.debug("request %s traceback", _request_id(request), exc_info=exc)
    body = anthropic_error_body(error, _request_id(request)) if anthropic else error.body()
    # ASCII escapes: an error message may quote client text, and must always encode.
    return response.json(body, status=error.status, ensure_ascii=True)


def _tune_connection(request: Request) -> None:
    """TCP keepalive and a 15 s TCP_USER_TIMEOUT (Linux), once per connection, so a dead peer
    is noticed (and its request cancelled) while the request waits or prefills."""
    ctx = request.conn_info.ctx if request.conn_info is not None else None
    if ctx is None or getattr(ctx, "tcp_tuned", False):
        return
    ctx.tcp_tuned = True
    sock = request.transport.get_extra_info("socket")
    if sock is None:
        return
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        options.append((socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, TCP_USER_TIMEOUT_MS))
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError:  # not a TCP socket (e.g. a unix socket): nothing to tune
            return


def _new_request_id() -> str:
    return "req-" + uuid.uuid4().hex


def _request_id(request: Request) -> str:
    """The request's id; requests that failed before middleware (413) get one here."""
    request_id = getattr(request.ctx, "request_id", None)
    if request_id is None:
        request_id = request.ctx.request_id = _new_request_id()
    return request_id


def _key_matches(request: Request, api_key: str) -> bool:
    expected = api_key.encode()
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    bearer = token.strip().encode() if scheme.lower() == "bearer" else b""
    header = request.headers.get("x-api-key", "").encode()
    # Both compares always run, so timing does not reveal which header was tried.
    ok_bearer = hmac.compare_digest(bearer, expected)
    ok_header = hmac.compare_digest(header, expected)
    return ok_bearer or ok_header


def _is_known_path(path: str) -> bool:
    return path in KNOWN_PATHS or path.startswith("/v1/models/")


def _unbuilt(path: str) -> str | None:
    """Why `path` is not served, when it is an endpoint ninfer knows and does not build (a
    trailing slash in the table names only what lies below it)."""
    for prefix, why in UNBUILT_ENDPOINTS.items():
        base = prefix.rstrip("/")
        below = path.startswith(base + "/") and path != base + "/"
        if below or (path.rstrip("/") == base and not prefix.endswith("/")):
            return f"{path}: {why}"
    return None


def _sanic_error(exc: SanicException, *, path: str) -> ProtocolError:
    status = int(getattr(exc, "status_code", 500) or 500)
    if status == 405 and not _is_known_path(path):  # only the OPTIONS catch-all matched it
        status = 404
    unbuilt = _unbuilt(path) if status == 404 else None
    if unbuilt is not None:
        return ProtocolError(unbuilt, status=404, code="unsupported_endpoint", type=INVALID_REQUEST)
    if status == 413:
        message = "the request body exceeds the server's --max-request-mib limit"
    elif status == 404:
        message = "no such endpoint"
    elif status == 405:
        message = "method not allowed on this endpoint"
    else:
        message = str(exc) or "bad request"
    code = SANIC_CODES.get(status, "invalid_request" if status < 500 else "internal_error")
    kind = INVALID_REQUEST if status < 500 else "server_error"
    return ProtocolError(message, status=status, code=code, type=kind)
