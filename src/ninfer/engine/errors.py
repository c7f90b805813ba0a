"""Typed engine errors. The server maps each `code` to the spec's HTTP status and error code."""

from __future__ import annotations


class EngineError(Exception):
    """Base class; `code` is the spec's error code for this failure."""

    code = "engine_error"


class ServerOverloaded(EngineError):
    """max_concurrency + max_pending requests are already in the engine (HTTP 429)."""

    code = "server_overloaded"


class QueueTimeout(EngineError):
    """The request was not admitted before its pending deadline (HTTP 503)."""

    code = "request_queue_timeout"


class ContextLengthExceeded(EngineError):
    """The prompt cannot fit max_context or the KV pool (HTTP 400)."""

    code = "context_length_exceeded"

    def __init__(self, num_prompt_tokens: int, limit: int, what: str = "max_context") -> None:
        self.num_prompt_tokens = num_prompt_tokens
        self.limit = limit
        super().__init__(
            f"the prompt has {num_prompt_tokens} tokens; the {what} ceiling is {limit} "
            "(including at least one generated token)"
        )


class InvalidRequest(EngineError):
    """A request the engine cannot run as specified (bad option value)."""

    code = "invalid_request"


class EngineClosed(EngineError):
    code = "engine_unavailable"


class EngineFailed(EngineError):
    """An engine-wide failure; the server reports /health 503 afterwards."""

    code = "engine_failure"


class ThinkingBudgetCapacityInsufficient(EngineError):
    """The output capacity passes the thinking cap but cannot hold the control suffix (HTTP 400)."""

    code = "thinking_budget_capacity_insufficient"

    def __init__(self, budget: int, num_capacity: int, num_needed: int) -> None:
        self.budget = budget
        self.num_capacity = num_capacity
        self.num_needed = num_needed
        super().__init__(
            f"the output capacity of {num_capacity} tokens extends past the thinking budget of "
            f"{budget} but cannot fit the early-close control suffix plus one answer token "
            f"({num_needed} tokens); raise max_tokens or lower the budget"
        )
