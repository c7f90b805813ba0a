"""`ninfer.Engine`: the library entry point, composing artifact, tokenizer, template and engine.

It sits above `chat/` and `engine/` (like `cli/` and `server/`): it loads an artifact, binds the
model on the chosen device, starts the engine's worker thread, and offers token-level `generate`
and conversation-level `chat` (template rendering in, output decoding out), sync and async.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from ninfer.artifact.reader import Artifact
from ninfer.chat.output_decoder import DeltaKind, OutputDecoder, ToolCall, ToolCallParseStats
from ninfer.chat.template import ChatTemplate
from ninfer.engine.core import EngineCore
from ninfer.engine.graphs import DecodeGraphs, unsupported_reason
from ninfer.engine.handles import AsyncRequestHandle, RequestHandle
from ninfer.engine.kv_pool import PagePool
from ninfer.engine.options import EngineOptions, resolve_device
from ninfer.engine.request import EngineEvent, EventKind, FinishReason, GenerationRequest, Timings
from ninfer.engine.runner import ModelRunner
from ninfer.engine.sampling import (
    NON_THINKING,
    THINKING,
    Sampler,
    SamplingParams,
    SamplingPreset,
    presets_for,
    resolve_sampling,
)
from ninfer.engine.scheduler import Scheduler, SchedulerConfig
from ninfer.engine.state_slots import SlotPool
from ninfer.model.cache import ModelCache
from ninfer.model.config import TextConfig
from ninfer.model.qwen3_5 import Qwen3_5Model
from ninfer.tokenizer import Tokenizer

SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class ChatUsage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass
class ChatEvent:
    """One conversation-level event: a reasoning or content delta, a tool call, or the end."""

    kind: str  # "admitted" | "progress" | "reasoning" | "content" | "tool_call" | "finished"
    text: str = ""
    tool_call: ToolCall | None = None
    finish_reason: FinishReason | None = None
    usage: ChatUsage | None = None
    timings: Timings | None = None
    tool_parse: ToolCallParseStats | None = None
    num_processed: int = 0
    num_prompt: int = 0
    num_output: int = 0  # committed output tokens so far (a commit may release no text yet)
    token_ids: list[int] = field(default_factory=list)
    stop_sequence: str | None = None  # finished: the stop string that ended the output


class Engine:
    """A loaded model serving generations from one worker thread."""

    def __init__(self, artifact: Artifact, options: EngineOptions) -> None:
        options.validate()
        self.options = options
        self.artifact = artifact
        self.model_id = artifact.name
        # Thinking-token cap for chat requests that start in thinking mode and pass no budget
        # of their own (`ninfer serve --default-thinking-budget`); None: uncapped.
        self.default_thinking_budget: int | None = None
        self.tokenizer = Tokenizer.from_json(artifact.tokenizer_json)
        self.template = ChatTemplate(artifact.chat_template())
        gen = artifact.header.generation
        self.eos_token_ids = frozenset(int(x) for x in gen.get("eos_token_ids", []))
        self.presets = _presets(gen, str(artifact.metadata.get("architecture")))
        self.config = TextConfig.from_hf(artifact.config["text"])
        dtype, device = DTYPES[options.dtype], torch.device(resolve_device(options.device))
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {options.device!r}: no CUDA device is available")
        self.model = Qwen3_5Model(
            self.config, artifact.load("text"), dtype=dtype, device=device, strict=True
        )
        kv_tokens = options.kv_capacity or options.max_context
        num_pages = -(-kv_tokens // options.page_size)
        extra = options.device_state_slots
        num_slots = options.max_concurrency + (options.max_concurrency if extra is None else extra)
        # [cuda-graphs] one spare state slot and KV page, never handed out, for graph capture
        use_graphs = device.type == "cuda" and not options.no_cuda_graph
        self.graph_status = _graph_status(self.model, use_graphs, options.max_concurrency)
        spare = 1 if self.graph_status == "on" else 0
        self.cache = ModelCache.allocate(
            self.config,
            num_pages=num_pages + spare,
            num_slots=num_slots + spare,
            page_size=options.page_size,
            dtype=dtype,
            device=device,
        )
        scheduler = Scheduler(
            SchedulerConfig(
                max_concurrency=options.max_concurrency,
                max_pending=options.max_pending_requests,
                pending_timeout_s=options.pending_timeout_ms / 1000.0,
                prefill_chunk=options.prefill_chunk,
                max_context=options.max_context,
            ),
            PagePool(num_pages, options.page_size),
            SlotPool(num_slots),
        )
        sampler = Sampler(num_sampleable=min(self.tokenizer.vocab_size, self.config.vocab_size))
        graphs = None
        if spare:
            graphs = DecodeGraphs(
                self.model,
                self.cache,
                max_batch=options.max_concurrency,
                max_pages=-(-options.max_context // options.page_size),
                dummy_slot=num_slots,
                dummy_page=num_pages,
            )
        runner = ModelRunner(self.model, self.cache, sampler, device, graphs=graphs)
        self.core = EngineCore(
            scheduler,
            runner,
            self.tokenizer,
            eos_token_ids=self.eos_token_ids,
            resolve_sampling=self._resolve_sampling,
        )

    @classmethod
    def load(cls, path: str | Path | None = None, **options: Any) -> Engine:
        """Open an artifact (the demo when None) with options named like the serve flags."""
        if path is None:
            from ninfer.artifact.demo import ensure_demo

            path = ensure_demo()
        return cls(Artifact(path), EngineOptions.from_kwargs(**options))

    # -- token level ---------------------------------------------------------------------------
    def _resolve_sampling(self, request: GenerationRequest) -> Any:
        preset = self.presets[THINKING if request.thinking else NON_THINKING]
        overrides = dict(request.sampling)
        greedy = bool(overrides.pop("greedy", False)) or self.options.greedy
        return resolve_sampling(preset, self.options.process_sampling, overrides, greedy=greedy)

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
        """
        request, decoder = self._chat_request(
            messages, tools, enable_thinking, template_kwargs, kwargs
        )
        tracker = _ChatTracker(decoder)
        for event in RequestHandle(self.core, request):
            yield from tracker.on_event(event)

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
        request, decoder = await asyncio.to_thread(
            self._chat_request, messages, tools, enable_thinking, template_kwargs, kwargs
        )
        tracker = _ChatTracker(decoder)
        async for event in AsyncRequestHandle(self.core, request):
            for out in tracker.on_event(event):
                yield out

    def _chat_request(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        enable_thinking: bool,
        template_kwargs: Mapping[str, Any] | None,
        kwargs: dict[str, Any],
    ) -> tuple[GenerationRequest, OutputDecoder]:
        kw = dict(template_kwargs or {})
        kw["enable_thinking"] = enable_thinking
        ids = self.render(messages, tools, **kw)
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
        request = self.make_request(
            ids,
            thinking=enable_thinking,
            thinking_budget=budget if starts_in_reasoning else None,
            stop=(*kwargs.pop("stop", ()), *decoder.stop_strings),
            **kwargs,
        )
        return request, decoder

    def close(self) -> None:
        self.core.close()
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

    def on_event(self, event: EngineEvent) -> list[ChatEvent]:
        if event.kind == EventKind.ADMITTED:
            return [ChatEvent("admitted", num_prompt=event.num_prompt)]
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
            return self._deltas(self.decoder.feed(event.text), event.token_ids, event.num_output)
        if event.kind == EventKind.ERROR:
            assert event.error is not None
            raise event.error
        if event.kind == EventKind.FINISHED:
            own_stop = event.stop_string in self.decoder.stop_strings
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
                    ),
                    timings=event.timings,
                    tool_parse=self.decoder.stats,
                    stop_sequence=None if own_stop else event.stop_string,
                )
            )
            return out
        return []

    @staticmethod
    def _deltas(deltas: list[Any], token_ids: list[int], num_output: int) -> list[ChatEvent]:
        out = []
        for d in deltas:
            if d.kind == DeltaKind.TOOL_CALL:
                out.append(ChatEvent("tool_call", tool_call=d.tool_call, num_output=num_output))
            elif d.text:
                kind = "reasoning" if d.kind == DeltaKind.REASONING else "content"
                out.append(ChatEvent(kind, text=d.text, token_ids=token_ids, num_output=num_output))
        return out


def _graph_status(model: Qwen3_5Model, wanted: bool, max_batch: int) -> str:
    """`on`, `off` (not wanted: CPU or no_cuda_graph) or `off: <why the model cannot>`."""
    if not wanted:
        return "off"
    reason = unsupported_reason(model, max_batch)
    return "on" if reason is None else f"off: {reason}"


def _presets(generation: Mapping[str, Any], architecture: str) -> dict[str, SamplingPreset]:
    stored = generation.get("presets")
    if isinstance(stored, Mapping) and THINKING in stored and NON_THINKING in stored:
        return {k: SamplingPreset(**stored[k]) for k in (THINKING, NON_THINKING)}
    return presets_for(architecture)
