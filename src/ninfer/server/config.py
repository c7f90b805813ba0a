"""ServerConfig: the HTTP-side settings of `ninfer serve` (the engine's live in EngineOptions).

Plain data, no imports beyond the standard library, so the CLI can build it before anything heavy
loads and tests can build it without a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KEEPALIVE_S = 5.0  # spec: ": keep-alive" after five seconds without a protocol event
# A response whose bytes the peer has not acknowledged for this long (a write that cannot proceed,
# or a final chunk never ACKed) means the client stopped reading: client_gone, engine cancelled.
DELIVERY_TIMEOUT_S = 20.0
LOG_STATS_INTERVAL_MS = 5000
# Bodies of this size keep max_concurrency + max_pending_requests (1 + 16) worst-case requests
# within about 4 GiB of host memory (measured per-MiB costs: docs/serving.md, Request size).
DEFAULT_MAX_REQUEST_MIB = 8


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    model_id: str | None = None  # None: the artifact's name
    api_key: str | None = field(default=None, repr=False)  # never in logs or reprs
    cors: bool = False
    max_request_mib: int = DEFAULT_MAX_REQUEST_MIB
    default_max_tokens: int = 8192
    no_thinking: bool = False
    preserve_thinking: bool = False
    keepalive_s: float = KEEPALIVE_S
    default_thinking_budget: int | None = None  # thinking cap for thinking-mode requests
    response_store_max_records: int = 1024  # the local Responses LRU (spec defaults)
    response_store_max_mib: int = 256
    delivery_timeout_s: float = DELIVERY_TIMEOUT_S
    request_log_jsonl: str | None = None  # append-mode JSONL measurement log; None: off
    log_stats_interval_ms: int = LOG_STATS_INTERVAL_MS  # throughput records; 0: off
    argv: tuple[str, ...] = field(default=(), repr=False)  # for server_start (key redacted)
    # Key of reasoning `encrypted_content`; None: $NINFER_REASONING_KEY, else a per-process key.
    reasoning_key: bytes | None = None

    @property
    def max_request_bytes(self) -> int:
        return self.max_request_mib * 1024 * 1024
