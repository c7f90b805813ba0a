"""`ninfer.Engine`: the library entry point, composing artifact, tokenizer, template and engine.

It sits above `chat/` and `engine/` (like `cli/` and `server/`): it loads an artifact, binds the
model on the chosen device, starts the engine's worker thread, and offers token-level `generate`
and conversation-level `chat` (template rendering in, output decoding out), sync and async.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from ninfer.artifact.media_settings import IMAGE_DEFAULTS, VIDEO_DEFAULTS
from ninfer.artifact.reader import Artifact
from ninfer.chat.cache_hints import explicit_markers, prompt_checkpoints
from ninfer.chat.output_decoder import DeltaKind, OutputDecoder, ToolCall, ToolCallParseStats
from ninfer.chat.template import ChatTemplate, ContentMark, load_default_template
from ninfer.engine.build import EngineParts, assemble, build
from ninfer.engine.handles import AsyncRequestHandle, RequestHandle
from ninfer.engine.options import EngineOptions
from ninfer.engine.request import (
    EngineEvent,
    EventKind,
    FinishReason,
    GenerationRequest,
    RequestStats,
    SchedulingTransition,
    Timings,
)
from ninfer.engine.sampling import SamplingParams, presets_for
from ninfer.engine.stats import EngineStats
from ninfer.media.errors import MediaError
from ninfer.media.fetch import FetchPolicy
from ninfer.media.layout import MediaPrompt, MediaTokens, expand_prompt
from ninfer.media.preparer import MediaLease, MediaLimits, MediaPreparer
from ninfer.media.settings import MediaSettings
from ninfer.media.sources import collect_media
from ninfer.model.mtp import MtpHead
from ninfer.model.qwen3_5 import Qwen3_5Model
from ninfer.tokenizer import Tokenizer

SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))
VISION_DISABLED = "vision_disabled"


@dataclass(frozen=True)
class ChatUsage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    cache_creation_tokens: int = 0


@dataclass
class ChatEvent:
    """One conversation-level event: a reasoning or content delta, a tool call, or the end.

    "submitted" comes first: the prompt is rendered and the engine took the request (capacity
    and context checks passed); `request_id` and `num_prompt` are set. Everything raised before
    it is a preparation failure; it lets a server start its response before admission.
    """

    kind: str  # "submitted" | "admitted" | "progress" | "reasoning" | "content" | "tool_call"
    # | "scheduling" (a pause-cycle boundary, only with `scheduling_events`) | "finished"
    text: str = ""
    tool_call: ToolCall | None = None
    finish_reason: FinishReason | None = None
    usage: ChatUsage | None = None
    # reasoning / content: the engine's cumulative snapshot at the latest commit (hidden commits
    # included); finished: the final one
    timings: Timings | None = None
    tool_parse: ToolCallParseStats | None = None
    num_processed: int = 0
    num_prompt: int = 0
    num_output: int = 0  # committed output tokens so far (a commit may release no text yet)
    token_ids: list[int] = field(default_factory=list)
    stop_sequence: str | None = None  # finished: the stop string that ended the output
    request_id: str = ""  # submitted: the engine's request id
    stats: RequestStats | None = None  # admitted and finished: the engine's per-request facts
    # admitted and finished: prompt tokens reused from the prefix cache, and the
    # `x-ninfer-prefix-cache` header value (why a hit or a miss)
    num_cached: int = 0
    prefix_cache: str | None = None
    # admitted: prompt tokens past the hit up to the last explicit cache marker (the usage's
    # cache_creation_tokens, known before any output)
    num_cache_creation: int = 0
    scheduling: SchedulingTransition | None = None  # scheduling: the boundary


class Engine:
    """A loaded model serving generations from one worker thread."""

    def __init__(
        self,
        parts: EngineParts,
        options: EngineOptions,
        template: ChatTemplate,
        model_id: str,
        artifact: Artifact | None = None,
    ) -> None:
        """Prefer `Engine.load` (an artifact) or `Engine.from_model` (a bound model)."""
        self.options = options
        self.artifact = artifact
        self.model_id = model_id
        # Thinking-token cap for chat requests that start in thinking mode and pass no budget
        # of their own (`ninfer serve --default-thinking-budget`); None: uncapped.
        self.default_thinking_budget: int | None = None
        # Chat requests ask for SCHEDULING events (pause / restore boundaries) when True:
        # `ninfer serve --request-log-jsonl` logs them as request_scheduling records.
        self.scheduling_events = False
        self.template = template
        self.parts = parts
        self.tokenizer = parts.tokenizer
        self.eos_token_ids = parts.eos_token_ids
        self.presets = parts.resolver.presets
        self.config = parts.config
        self.model = parts.model
        self.cache = parts.cache
        self.graph_status = parts.graph_status
        self.core = parts.core
        # [vision] the media preparer (host side: fetch, decode, resize); the tower is the
        # runner's. Both exist only when the engine was built with vision.
        self.media: MediaPreparer | None = None
        self.media_tokens = MediaTokens.from_config(
            artifact.config.get("model") or {} if artifact is not None else {}
        )
        if options.vision and artifact is not None:
            self.media = media_preparer(artifact, options, parts.model.dtype)

    @classmethod
    def load(cls, path: str | Path | None = None, **options: Any) -> Engine:
        """Open an artifact (the demo when None) with options named like the serve flags."""
        if path is None:
            from ninfer.artifact.demo import ensure_demo

            path = ensure_demo()
        artifact = Artifact(path)
        try:
            return cls.from_artifact(artifact, EngineOptions.from_kwargs(**options))
        except BaseException:
            artifact.close()
            raise

    @classmethod
    def from_artifact(
        cls,
        artifact: Artifact,
        options: EngineOptions,
        *,
        on_graph_capture: Callable[[int, int, float], None] | None = None,
    ) -> Engine:
        """An engine over an opened artifact (the caller closes it if this raises).

        `on_graph_capture(rows, pages_wide, seconds)` hears of each CUDA graph captured."""
        parts = build(artifact, options, on_graph_capture=on_graph_capture)
        return cls(parts, options, ChatTemplate(artifact.chat_template()), artifact.name, artifact)

    @classmethod
    def from_model(
        cls,
        model: Qwen3_5Model,
        *,
        architecture: str,
        model_id: str = "synthetic",
        mtp: MtpHead | None = None,
        **options: Any,
    ) -> Engine:
        """An engine over an already bound model (random weights of a real shape in benches),
        with the Qwen3.5 tokenizer and ninfer's chat template; the model stays on its device.
        `mtp`: its bound MTP head, needed with spec="mtp"."""
        opts = EngineOptions.from_kwargs(**options)
        parts = assemble(
            model,
            Tokenizer.qwen3_5(),
            opts,
            presets=presets_for(architecture),
            eos_token_ids=frozenset(),
            mtp=mtp,
        )
        return cls(parts, opts, ChatTemplate(load_default_template()), model_id)

    # -- token level ---------------------------------------------------------------------------
    def make_request(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = 256,
        stop: Sequence[str] = (),
        thinking: bool = True,
        request_id: str | None = None,
        ignore_eos: bool = False,
        thinking_budget: int | None = None,
        media: MediaPrompt | None = None,
        cache_checkpoints: Sequence[int] = (),
        cache_marked: int = 0,
        scheduling_events: bool = False,
        **sampling: Any,
    ) -> GenerationRequest:
        unknown = sorted(set(sampling) - set(SAMPLING_FIELDS))
        if unknown:
            raise TypeError(f"unknown sampling option(s): {', '.join(unknown)}")
        ids = self.tokenizer.encode_template(prompt) if isinstance(prompt, str) else list(prompt)
        return GenerationRequest(
            prompt_ids=tuple(ids),
            max_tokens=max_tokens,
            sampling=sampling,
            thinking=thinking,
            stop=tuple(stop),
            request_id=request_id,
            ignore_eos=ignore_eos,
            thinking_budget=thinking_budget,
            media=media,
            cache_checkpoints=tuple(cache_checkpoints),
            cache_marked=cache_marked,
            scheduling_events=scheduling_events,
        )

    def generate(self, prompt: str | Sequence[int], **kwargs: Any) -> Iterator[EngineEvent]:
        """Stream one generation's events. A str prompt is encoded with special tokens honoured."""
        return iter(RequestHandle(self.core, self.make_request(prompt, **kwargs)))

    async def agenerate(
        self, prompt: str | Sequence[int], **kwargs: Any
    ) -> AsyncIterator[EngineEvent]:
        async for event in AsyncRequestHandle(self.core, self.make_request(prompt, **kwargs)):
            yield event

    # -- conversation level ---------------------------------------------------------------------
    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> list[int]:
        return self.template.render_ids(self.tokenizer, messages, tools=tools, **template_kwargs)

    def chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        enable_thinking: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatEvent]:
        """Render, generate and decode into reasoning / content / tool-call events.

        `thinking_budget=N` (in kwargs) caps thinking at N model tokens when the output starts
        in thinking mode; omitted, `default_thinking_budget` applies. `single_tool_call=True`
        ends the turn after its first complete tool call (parallel_tool_calls: false).
        `cache_marks` (explicit prompt-cache boundaries as `ContentMark`s) and `cache_implicit`
        (the automatic candidate at the end of the latest content part) choose where the prefix
        cache may write.
        """
        request, decoder, lease = self._chat_request(
            messages, tools, enable_thinking, template_kwargs, kwargs
        )
        tracker = _ChatTracker(decoder)
        handle = RequestHandle(self.core, request)
        try:
            yield ChatEvent(
                "submitted", request_id=handle.request_id, num_prompt=len(request.prompt_ids)
            )
            for event in handle:
                yield from tracker.on_event(event)
        finally:  # abandoned before or between events: the engine request must not run on
            if not handle.done:
                handle.cancel()
            if lease is not None:
                lease.release()

    async def achat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        enable_thinking: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatEvent]:
        # Rendering and tokenizing a long conversation takes real CPU time: do it off the event
        # loop so one large prompt does not stall every other connection.
        request, decoder, lease = await asyncio.to_thread(
            self._chat_request, messages, tools, enable_thinking, template_kwargs, kwargs
        )
        tracker = _ChatTracker(decoder)
        handle = AsyncRequestHandle(self.core, request)
        try:
            yield ChatEvent(
                "submitted", request_id=handle.request_id, num_prompt=len(request.prompt_ids)
            )
            async for event in handle:
                for out in tracker.on_event(event):
                    yield out
        finally:  # abandoned before or between events: the engine request must not run on
            if not handle.done:
                handle.cancel()
            if lease is not None:
                lease.release()

    # -- media ------------------------------------------------------------------------------------
    def prepare_prompt(
        self, ids: list[int], messages: list[dict[str, Any]]
    ) -> tuple[list[int], MediaPrompt | None, MediaLease | None]:
        """Rendered ids -> (expanded ids, media prompt, lease) for the media parts of
        `messages`; text-only conversations pass through untouched. The caller releases the
        lease once the request is over."""
        sources = collect_media(messages)
        if not sources:
            return ids, None, None
        if self.media is None:
            raise MediaError(
                f"{sources[0].param}: image and video input needs an engine started with "
                "vision enabled (ninfer serve --vision)",
                code=VISION_DISABLED,
                param=sources[0].param,
            )
        lease = self.media.prepare(sources)
        try:
            prompt = expand_prompt(ids, lease.items, self.media_tokens, self.tokenizer.encode_text)
        except BaseException:
            lease.release()
            raise
        return list(prompt.token_ids), prompt, lease

    def media_stats(self) -> dict[str, int]:
        """[vision] Media counters: the prepared-payload cache (hits, misses, single-flight
        waits, builds, evictions, budget rejections, retained / live bytes) and the tower
        (items encoded, outputs reused, items skipped inside a reused prefix). Empty without
        vision."""
        if self.media is None:
            return {}
        tower = self.parts.core.runner.tower_cache
        return {
            **self.media.cache.snapshot(),
            "tower_encoded": tower.encoded if tower else 0,
            "tower_hits": tower.hits if tower else 0,
            "tower_prefix_skips": tower.prefix_skips if tower else 0,
            "tower_cache_bytes": tower.bytes if tower else 0,
        }

    def count_prompt_tokens(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> int:
        """Prompt tokens after template rendering and media expansion (no generation)."""
        ids = self.render(messages, tools, **template_kwargs)
        ids, _, lease = self.prepare_prompt(ids, messages)
        if lease is not None:
            lease.release()
        return len(ids)

    def _chat_request(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        enable_thinking: bool,
        template_kwargs: Mapping[str, Any] | None,
        kwargs: dict[str, Any],
    ) -> tuple[GenerationRequest, OutputDecoder, MediaLease | None]:
        kw = dict(template_kwargs or {})
        kw["enable_thinking"] = enable_thinking
        marks = [
            ContentMark(*m) if isinstance(m, tuple) else m for m in kwargs.pop("cache_marks", ())
        ]
        implicit = kwargs.pop("cache_implicit", True)
        ids, offsets = self.template.render_ids_marked(
            self.tokenizer, messages, marks, tools=tools, **kw
        )
        specials = self.tokenizer.special_tokens
        checkpoints = prompt_checkpoints(
            ids,
            im_start=specials.get("<|im_start|>"),
            im_end=specials.get("<|im_end|>"),
            markers=offsets,
            implicit=implicit,
        )
        # the client's last explicit marker: its prompt prefix is this request's cache creation
        marked = max(explicit_markers(offsets, len(ids)), default=0)
        ids, media, lease = self.prepare_prompt(ids, messages)
        if media is not None:  # the candidates were found in the ids before media expansion
            checkpoints = [media.expanded_offset(t) for t in checkpoints]
            marked = media.expanded_offset(marked) if marked else 0
        # The template continues a final assistant message only without a generation prompt
        # (an assistant prefill); otherwise it opens a fresh assistant turn, thinking included.
        continuing = (
            bool(messages)
            and messages[-1].get("role") == "assistant"
            and kw.get("add_generation_prompt", True) is False
        )
        starts_in_reasoning = enable_thinking and not continuing
        budget = kwargs.pop("thinking_budget", None) or self.default_thinking_budget
        # single_tool_call (parallel_tool_calls: false): the decoder names the stop string that
        # ends the turn at its first complete call, and restores it when the engine cuts there.
        decoder = OutputDecoder(
            tools=tools,
            starts_in_reasoning=starts_in_reasoning,
            single_call=bool(kwargs.pop("single_tool_call", False)),
        )
        try:
            request = self.make_request(
                ids,
                thinking=enable_thinking,
                thinking_budget=budget if starts_in_reasoning else None,
                media=media,
                cache_checkpoints=checkpoints,
                cache_marked=marked,
                scheduling_events=kwargs.pop("scheduling_events", self.scheduling_events),
                stop=(*kwargs.pop("stop", ()), *decoder.stop_strings),
                **kwargs,
            )
        except BaseException:
            if lease is not None:
                lease.release()
            raise
        return request, decoder, lease

    def stats(self) -> EngineStats:
        """The engine's latest published counters and gauges (see engine/stats.py)."""
        return self.core.stats()

    def close(self) -> None:
        self.core.close()
        if self.media is not None:
            self.media.close()
        if self.artifact is not None:
            self.artifact.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ChatTracker:
    """Feeds committed text through the output decoder and counts reasoning tokens."""

    def __init__(self, decoder: OutputDecoder) -> None:
        self.decoder = decoder
        self.num_reasoning = 0
        self.num_output = 0
        self.timings: Timings | None = None  # the latest commit's snapshot, hidden ones included

    def on_event(self, event: EngineEvent) -> list[ChatEvent]:
        if event.kind == EventKind.ADMITTED:
            return [
                ChatEvent(
                    "admitted",
                    num_prompt=event.num_prompt,
                    num_cached=event.num_cached,
                    prefix_cache=event.prefix_cache,
                    num_cache_creation=event.num_cache_creation,
                    stats=event.stats,
                )
            ]
        if event.kind == EventKind.SCHEDULING:
            return [ChatEvent("scheduling", scheduling=event.scheduling)]
        if event.kind == EventKind.PROGRESS:
            return [
                ChatEvent(
                    "progress", num_processed=event.num_processed, num_prompt=event.num_prompt
                )
            ]
        if event.kind == EventKind.TOKENS:
            if self.decoder.in_reasoning:
                self.num_reasoning += len(event.token_ids)
            self.num_output = event.num_output
            self.timings = event.timings or self.timings
            return self._deltas(self.decoder.feed(event.text), event.token_ids, event.num_output)
        if event.kind == EventKind.ERROR:
            assert event.error is not None
            raise event.error
        if event.kind == EventKind.FINISHED:
            own_stop = event.stop_string in self.decoder.stop_strings
            self.timings = event.timings or self.timings
            out = self._deltas(self.decoder.feed(event.text), [], self.num_output)
            out += self._deltas(self.decoder.finish(event.stop_string), [], self.num_output)
            usage = event.usage
            assert usage is not None
            out.append(
                ChatEvent(
                    "finished",
                    finish_reason=event.finish_reason,
                    usage=ChatUsage(
                        usage.prompt_tokens,
                        usage.completion_tokens,
                        usage.cached_tokens,
                        self.num_reasoning,
                        usage.cache_creation_tokens,
                    ),
                    timings=event.timings,
                    tool_parse=self.decoder.stats,
                    stop_sequence=None if own_stop else event.stop_string,
                    stats=event.stats,
                    num_cached=event.num_cached,
                    prefix_cache=event.prefix_cache,
                )
            )
            return out
        return []

    def _deltas(self, deltas: list[Any], token_ids: list[int], num_output: int) -> list[ChatEvent]:
        out = []
        for d in deltas:
            if d.kind == DeltaKind.TOOL_CALL:
                out.append(ChatEvent("tool_call", tool_call=d.tool_call, num_output=num_output))
            elif d.text:
                kind = "reasoning" if d.kind == DeltaKind.REASONING else "content"
                out.append(
                    ChatEvent(
                        kind,
                        text=d.text,
                        token_ids=token_ids,
                        num_output=num_output,
                        timings=self.timings,
                    )
                )
        return out


def media_preparer(artifact: Artifact, options: EngineOptions, dtype: torch.dtype) -> MediaPreparer:
    """[vision] The media preparer, from the artifact's preprocessing settings (an engine's, or
    a token counter's that expands media without loading the model)."""
    media = artifact.config.get("media")
    if not media:  # converted before artifacts carried settings: the Qwen3.5 defaults
        media = {"image": IMAGE_DEFAULTS, "video": VIDEO_DEFAULTS}
    limits = MediaLimits(
        cache_mib=options.media_cache_mib,
        live_mib=options.media_live_mib,
        threads=options.media_preprocess_threads,
        fetch=FetchPolicy(allow_private=options.allow_private_media_urls),
    )
    return MediaPreparer(MediaSettings.from_config(media), dtype=dtype, limits=limits)
