"""ServerConfig: the HTTP-side settings of `ninfer serve` (the engine's live in EngineOptions).

Plain data, no imports beyond the standard library, so the CLI can build it before anything heavy
loads and tests can build it without a model.
"""

from __future__ import annotations

from dataclasses import dataclass

KEEPALIVE_S = 5.0  # spec: ": keep-alive" after five seconds without a protocol event
# Bodies of this size keep max_concurrency + max_pending_requests (1 + 16) worst-case requests
# within about 4 GiB of host memory (measured per-MiB costs: docs/serving.md, Request size).
DEFAULT_MAX_REQUEST_MIB = 8


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    model_id: str | None = None  # None: the artifact's name
    api_key: str | None = None
    cors: bool = False
    max_request_mib: int = DEFAULT_MAX_REQUEST_MIB
    default_max_tokens: int = 8192
    no_thinking: bool = False
    preserve_thinking: bool = False
    keepalive_s: float = KEEPALIVE_S
    default_thinking_budget: int | None = None  # thinking cap for thinking-mode requests
    response_store_max_records: int = 1024  # the local Responses LRU (spec defaults)
    response_store_max_mib: int = 256
    # Key of reasoning `encrypted_content`; None: $NINFER_REASONING_KEY, else a per-process key.
    reasoning_key: bytes | None = None

    @property
    def max_request_bytes(self) -> int:
        return self.max_request_mib * 1024 * 1024
