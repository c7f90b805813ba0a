"""What goes into the engine (GenerationRequest) and what comes out (EngineEvent).

The engine works on token ids: callers render prompts with the chat template first. Events carry
committed token ids and their UTF-8-safe text (after stop-string withholding), plus the terminal
finish reason, usage and llama.cpp-style timings. Nothing here imports torch.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ninfer.media.layout import MediaPrompt


class FinishReason(enum.Enum):
    STOP = "stop"  # an eos / stop token id or a stop string
    LENGTH = "length"  # max_tokens reached
    CONTEXT = "context"  # max_context reached or the KV pool is exhausted
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class GenerationRequest:
    """One generation. `max_tokens` counts committed output tokens, including a stop token.

    `sampling` holds the request's own sampler fields (SamplingParams names; None = not given):
    they override the process options, which override the artifact's preset for `thinking`.
    `cache_checkpoints` are prompt token offsets where the prefix cache should capture a
    checkpoint (the chat layer's candidates: cache markers, the implicit candidate, the input
    checkpoint before the generation prologue); the engine adds the end of the conversation.
    `cache_marked` is the offset of the client's last explicit cache marker (0: none): the prompt
    tokens past the cache hit up to it are this request's cache creation (Anthropic's
    `cache_creation_input_tokens`), known at admission.
    """

    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: Mapping[str, Any] = field(default_factory=dict)
    thinking: bool = True
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] | None = None  # None: the artifact's eos ids
    ignore_eos: bool = False
    request_id: str | None = None
    pending_timeout_s: float | None = None  # None: the engine's --pending-timeout-ms
    # Cap on model-sampled tokens while thinking is open; set only for requests whose output
    # starts inside `<think>`. At the cap the engine inserts Qwen's early-close suffix.
    thinking_budget: int | None = None
    # [vision] Prepared media of a multimodal prompt: `prompt_ids` are then its expanded ids
    # (media.token_ids); the runner encodes the media before the first prefill chunk.
    media: MediaPrompt | None = None
    cache_checkpoints: tuple[int, ...] = ()
    cache_marked: int = 0
    # SCHEDULING events at each pause / restore boundary (the server's request_scheduling
    # records; off unless request logging is on, so unlogged requests pay nothing)
    scheduling_events: bool = False


@dataclass(frozen=True)
class Usage:
    """`cached_tokens`: prompt tokens read from the prefix cache; `cache_creation_tokens`:
    prompt tokens past them up to the client's last explicit cache marker (written there for
    later requests). Disjoint, so a client may add them to the uncached rest, as Anthropic's
    usage is added up."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    cache_creation_tokens: int = 0


@dataclass(frozen=True)
class Timings:
    """llama.cpp-compatible timings (spec: "llama.cpp-compatible request observations")."""

    cache_n: int
    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    # speculative requests that drafted: every drafted token, and the drafts accepted
    draft_n: int | None = None
    draft_n_accepted: int | None = None

    @property
    def prompt_per_token_ms(self) -> float:
        return self.prompt_ms / self.prompt_n if self.prompt_n and self.prompt_ms else 0.0

    @property
    def prompt_per_second(self) -> float:
        return self.prompt_n * 1000.0 / self.prompt_ms if self.prompt_n and self.prompt_ms else 0.0

    @property
    def predicted_per_token_ms(self) -> float:
        steps = max(self.predicted_n - 1, 0)
        return self.predicted_ms / steps if steps and self.predicted_ms else 0.0

    @property
    def predicted_per_second(self) -> float:
        steps = max(self.predicted_n - 1, 0)
        return steps * 1000.0 / self.predicted_ms if steps and self.predicted_ms else 0.0

    def to_dict(self) -> dict[str, float | int]:
        return {
            "cache_n": self.cache_n,
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_per_token_ms,
            "prompt_per_second": self.prompt_per_second,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": self.predicted_per_token_ms,
            "predicted_per_second": self.predicted_per_second,
            **(
                {"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted}
                if self.draft_n
                else {}
            ),
        }


@dataclass(frozen=True)
class RequestStats:
    """Engine-side facts of one request, on its ADMITTED and terminal events.

    Times are `time.monotonic()` instants, so the server can measure its own stages against them
    (TTFT from its own clock start, queue wait from submission). Output ids and the resolved
    sampler are filled on the terminal event only.
    """

    t_submitted: float
    t_admitted: float | None = None
    t_first_token: float | None = None
    t_last_token: float | None = None
    t_finished: float | None = None
    num_prefill_tokens: int = 0  # prompt tokens this request computed (prefix hits excluded)
    num_cached_tokens: int = 0  # prompt tokens reused from the prefix cache (none yet)
    output_ids: tuple[int, ...] = ()  # every committed output token, control tokens included
    sampling: Mapping[str, Any] = field(default_factory=dict)  # the resolved sampler and seed
    # terminal: resource pressure (request_done.scheduling): pauses, restores by route, tokens
    # recomputed by replay, seconds spent paused, and the bytes its snapshots moved
    num_preemptions: int = 0
    num_snapshot_restores: int = 0
    num_replay_restores: int = 0
    num_replayed_tokens: int = 0
    paused_s: float = 0.0
    transfer_bytes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # speculative engines, terminal event: request_done.speculative (backend, draft_window,
    # rounds, drafted_tokens, accepted_tokens, fallback_steps, accepted_per_position)
    speculative: Mapping[str, Any] | None = None

    @property
    def queue_wait_s(self) -> float | None:
        """Submission to admission; None while (or when never) admitted."""
        return None if self.t_admitted is None else self.t_admitted - self.t_submitted


@dataclass(frozen=True)
class SchedulingTransition:
    """One pause-cycle boundary of a request (spec: request_scheduling).

    `transition`: pause_started, paused, restore_started, restored, replay_complete,
    recovery_complete, snapshot_revoked or terminal. `route` is "snapshot", "replay" or None
    (not chosen yet). `steady_ns` is the worker's monotonic clock, `elapsed_ns` counts from
    submission; `progress` holds the landed prefill / decode / replay tokens, engine-wide
    ("global") and of this request ("request"), so the difference between two boundaries shows
    what other requests completed meanwhile.
    """

    transition: str
    preemption_index: int
    route: str | None
    steady_ns: int
    elapsed_ns: int
    progress: Mapping[str, Mapping[str, int]]


class EventKind(enum.Enum):
    ADMITTED = "admitted"  # a lane and state slot were assigned; prompt processing starts
    PROGRESS = "progress"  # prompt processing advanced (prefill chunk committed)
    TOKENS = "tokens"  # committed output tokens (and the text they release)
    FINISHED = "finished"  # terminal: finish_reason, usage, timings
    ERROR = "error"  # terminal: a typed EngineError
    SCHEDULING = "scheduling"  # a pause / restore boundary (only with scheduling_events)


@dataclass
class EngineEvent:
    request_id: str
    kind: EventKind
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    num_processed: int = 0  # PROGRESS: prompt tokens processed so far (cache included)
    num_prompt: int = 0
    num_output: int = 0  # TOKENS: committed output tokens so far, this event's included
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    # TOKENS: the cumulative snapshot at this commit (engine clock); FINISHED: the final one
    timings: Timings | None = None
    error: Exception | None = None
    stop_string: str | None = None  # FINISHED: the stop string that ended the output, if one did
    num_control: int = 0  # TOKENS: how many of token_ids were inserted without sampling
    stats: RequestStats | None = None  # ADMITTED and terminal events: the engine's facts
    # ADMITTED and FINISHED: prompt tokens reused from the prefix cache, and the
    # `x-ninfer-prefix-cache` value saying why (e.g. "hit=812; path=checkpoint", "miss=evicted")
    num_cached: int = 0
    prefix_cache: str | None = None
    num_cache_creation: int = 0  # ADMITTED: Usage.cache_creation_tokens, fixed at admission
    # FINISHED: how often this request was paused, and restored by snapshot or by replay
    num_preemptions: int = 0
    num_snapshot_restores: int = 0
    num_replay_restores: int = 0
    num_replayed_tokens: int = 0
    scheduling: SchedulingTransition | None = None  # SCHEDULING: the boundary

    @property
    def is_terminal(self) -> bool:
        return self.kind in (EventKind.FINISHED, EventKind.ERROR)
