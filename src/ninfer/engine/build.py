"""Composition: engine options + an artifact -> model -> pools -> decode step -> EngineCore.

Imports engine/, model/, artifact/ and tokenizer/ (never api.py, chat/ or anything above). The
public `ninfer.Engine` (api.py) keeps only the user-facing surface; everything that turns options
into running parts lives here, so benches and tests build engines the same way. Sizing rules
(KV pages, lane slots and device StateImage slots, the host context budget, the `auto` KV
capacity) are written once, here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ninfer.artifact.reader import Artifact
from ninfer.engine.core import EngineCore
from ninfer.engine.graphs import DecodeStep, OnCapture, unsupported_reason
from ninfer.engine.kv_pool import PagePool
from ninfer.engine.options import KV_AUTO, EngineOptions, resolve_device
from ninfer.engine.prefix_cache import PrefixCache
from ninfer.engine.runner import ModelRunner
from ninfer.engine.sampling import (
    NON_THINKING,
    THINKING,
    SamplingPreset,
    SamplingResolver,
    presets_for,
)
from ninfer.engine.scheduler import Scheduler, SchedulerConfig
from ninfer.engine.spec_step import SpecStep
from ninfer.engine.state_images import HostPool, StateImages
from ninfer.engine.state_slots import SlotPool
from ninfer.model.cache import ModelCache
from ninfer.model.config import TextConfig
from ninfer.model.layers.gated_attention import warm_prefill_attention
from ninfer.model.lm_head_draft import ShortlistHead
from ninfer.model.mtp import MtpHead
from ninfer.model.qwen3_5 import Qwen3_5Model, tiles_bytes
from ninfer.model.vision import VisionConfig, VisionTower
from ninfer.tokenizer import Tokenizer

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
GIB = 1 << 30
# `--kv-capacity auto` stops here: 64M tokens at 64 per page, far beyond any context of the family
# (a tiny test model on a large GPU would otherwise ask the page pool for billions of pages).
MAX_PAGES = 1 << 20
MIB = 1 << 20
DEFAULT_HOST_MIB = 8192  # plus DEFAULT_HOST_IMAGES StateImages (the spec's default budget)
DEFAULT_HOST_IMAGES = 8
log = logging.getLogger("ninfer.engine")


@dataclass
class EngineParts:
    """What `build` made; the public Engine holds these."""

    config: TextConfig
    model: Qwen3_5Model
    cache: ModelCache
    core: EngineCore
    tokenizer: Tokenizer
    resolver: SamplingResolver
    eos_token_ids: frozenset[int]
    graph_status: str  # "on", "off" or "off: <why the model cannot>"
    num_pages: int  # KV pages the scheduler hands out
    num_slots: int  # state slots: lanes, then device StateImage slots
    host_context_bytes: int  # the pinned host budget for StateImages, KV and snapshots


def build(
    artifact: Artifact, options: EngineOptions, *, on_graph_capture: OnCapture | None = None
) -> EngineParts:
    """Bind the artifact's text model on the options' device and assemble an engine over it."""
    options.validate()
    gen = artifact.header.generation
    presets = presets_of(gen, str(artifact.metadata.get("architecture")))
    config = TextConfig.from_hf(artifact.config["text"])
    dtype, device = DTYPES[options.dtype], torch.device(resolve_device(options.device))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {options.device!r}: no CUDA device is available")
    model = Qwen3_5Model(
        config,
        artifact.load("text"),
        dtype=dtype,
        device=device,
        strict=True,
        decode_tiles=options.decode_tiles,
    )
    vision = _vision_tower(artifact, dtype, device) if options.vision else None
    mtp = _mtp_head(artifact, model) if options.spec == "mtp" else None
    if options.decode_tiles:
        parts = [p for layer in model.layers for p in (layer.mixer, layer.ffn)]
        parts += [mtp.attention, mtp.ffn] if mtp is not None else []
        log.info("decode tiles: %.1f GiB beside the row-major weights", tiles_bytes(parts) / GIB)
    return assemble(
        model,
        Tokenizer.from_json(artifact.tokenizer_json),
        options,
        presets=presets,
        eos_token_ids=frozenset(int(x) for x in gen.get("eos_token_ids", [])),
        vision=vision,
        on_graph_capture=on_graph_capture,
        mtp=mtp,
    )


def _mtp_head(artifact: Artifact, model: Qwen3_5Model) -> MtpHead:
    """The artifact's MTP head bound beside the target (spec="mtp")."""
    if "mtp" not in artifact.components:
        raise ValueError(
            "spec mtp: the artifact has no MTP head (convert the checkpoint with its mtp component)"
        )
    return MtpHead(model, artifact.load("mtp"))


def _vision_tower(artifact: Artifact, dtype: torch.dtype, device: torch.device) -> VisionTower:
    """[vision] The artifact's vision tower on the device."""
    if "vision" not in artifact.components:
        raise ValueError(
            "vision: the artifact has no vision tower (convert the checkpoint with its vision "
            "component)"
        )
    config = VisionConfig.from_dict(artifact.config["vision"])
    return VisionTower(config, artifact.load("vision"), dtype=dtype, device=device)


def assemble(
    model: Qwen3_5Model,
    tokenizer: Tokenizer,
    options: EngineOptions,
    *,
    presets: Mapping[str, SamplingPreset],
    eos_token_ids: frozenset[int],
    vision: VisionTower | None = None,
    on_graph_capture: OnCapture | None = None,
    mtp: MtpHead | None = None,
    static_rounds: bool = False,
) -> EngineParts:
    """Pools, decode step, runner and worker over a bound model (benches pass random weights).
    With spec="mtp", `mtp` is the bound head: its KV joins the cache as one more attention
    layer and every decode row runs through the speculative round (engine/spec_step.py).
    `static_rounds` runs rounds over padded static buffers even without CUDA graphs (the CPU
    tests of the graph body)."""
    options.validate()
    k = options.num_drafts
    if k and mtp is None:
        raise ValueError("spec mtp needs the model's MTP head")
    if options.decode_tiles and not model.decode_tiles:  # a bound model's tiles are its own
        raise ValueError("decode_tiles is chosen when the weights are bound: the model has none")
    extra_layers = 1 if k else 0
    config, device, dtype = model.config, model.device, model.dtype
    # Build the detokenizer's byte table (about a second) now, not inside the first request's
    # submit on a server's event loop.
    _ = tokenizer.byte_table
    # likewise the cuDNN prefill-attention kernels (1-2 s on their first call)
    warm_prefill_attention(
        config.num_attention_heads, config.num_key_value_heads, config.head_dim,
        dtype=dtype, device=device,
    )  # fmt: skip
    resolver = SamplingResolver(presets, options.process_sampling, greedy=options.greedy)
    lanes = options.max_concurrency
    extra = options.device_state_slots
    num_slots = lanes + (lanes if extra is None else extra)
    wanted = device.type == "cuda" and not options.no_cuda_graph
    # a round feeds k + 1 tokens per lane: the MoE path must be sync-free for that many rows
    graph_status = _graph_status(model, wanted, lanes * (k + 1) if k else lanes)
    use_graphs = graph_status == "on"
    static = use_graphs or (static_rounds and k > 0)
    spare = 1 if static else 0  # one state slot and KV page, never handed out, for padding
    num_pages = _num_pages(options, config, model, num_slots + spare, dtype, extra_layers)
    cache = ModelCache.allocate(
        config,
        num_pages=num_pages + spare,
        num_slots=num_slots + spare,
        page_size=options.page_size,
        dtype=dtype,
        device=device,
        kv_dtype=options.kv_dtype,
        extra_attention_layers=extra_layers,
    )
    pages = PagePool(num_pages, options.page_size)
    image_bytes = ModelCache.bytes_per_slot(config, dtype)
    host_bytes = host_context_bytes(options, image_bytes)
    page_bytes = ModelCache.bytes_per_page(
        config, options.page_size, dtype, options.kv_dtype, extra_layers
    )
    images = StateImages(range(lanes, num_slots), HostPool(host_bytes), image_bytes, page_bytes)
    scheduler = Scheduler(
        SchedulerConfig(
            max_concurrency=lanes,
            max_pending=options.max_pending_requests,
            pending_timeout_s=options.pending_timeout_ms / 1000.0,
            prefill_chunk=options.prefill_chunk,
            max_context=options.max_context,
            max_batched_tokens=_token_budget(options),
            draft_tokens=k,
        ),
        pages,
        SlotPool(lanes),
        images=images,
        cache=None if options.no_prefix_reuse else PrefixCache(pages, images),
    )
    decode = DecodeStep(
        model,
        cache,
        max_batch=lanes,
        max_pages=-(-options.max_context // options.page_size),
        num_sampleable=min(tokenizer.vocab_size, config.vocab_size),
        use_graphs=use_graphs,
        dummy_slot=num_slots if use_graphs else None,
        dummy_page=num_pages if use_graphs else None,
        on_capture=on_graph_capture,
    )
    num_sampleable = min(tokenizer.vocab_size, config.vocab_size)
    spec = None
    if k:
        assert mtp is not None
        spec = SpecStep(
            model,
            mtp,
            cache,
            draft_tokens=k,
            num_sampleable=num_sampleable,
            counts=decode.counts,
            max_batch=lanes,
            max_pages=-(-options.max_context // options.page_size),
            use_graphs=use_graphs,
            static=static,
            dummy_slot=num_slots if static else None,
            dummy_page=num_pages if static else None,
            shortlist=ShortlistHead(model.lm_head, num_sampleable)
            if options.lm_head_draft
            else None,
        )
    core = EngineCore(
        scheduler,
        ModelRunner(
            model,
            cache,
            decode,
            vision=vision,
            tower_cache_bytes=options.vision_cache_mib << 20,
            spec=spec,
        ),
        tokenizer,
        eos_token_ids=eos_token_ids,
        resolve_sampling=resolver.resolve,
        # a speculative engine plans ahead only over steps whose rounds all chain their next
        # one (`Scheduler.may_plan_ahead`); it lands any other step before planning the next
        overlap=not options.no_overlap,
    )
    return EngineParts(
        config,
        model,
        cache,
        core,
        tokenizer,
        resolver,
        eos_token_ids,
        graph_status,
        num_pages,
        num_slots,
        host_bytes,
    )


def _token_budget(options: EngineOptions) -> int | None:
    """`max_batched_tokens`; with speculation the default also fits every lane's verify row."""
    if options.max_batched_tokens is not None or not options.num_drafts:
        return options.max_batched_tokens
    return options.prefill_chunk + options.max_concurrency * (options.num_drafts + 1)


def host_context_bytes(options: EngineOptions, image_bytes: int) -> int:
    """`--host-context-mib`, or the default 8192 MiB plus eight StateImages."""
    if options.host_context_mib is not None:
        return options.host_context_mib * MIB
    return DEFAULT_HOST_MIB * MIB + DEFAULT_HOST_IMAGES * image_bytes


def _num_pages(
    options: EngineOptions,
    config: TextConfig,
    model: Qwen3_5Model,
    num_slots: int,
    dtype: torch.dtype,
    extra_layers: int = 0,
) -> int:
    """KV pages for `--kv-capacity`: explicit tokens, `auto`, or (None) follow max_context."""
    if options.kv_capacity != KV_AUTO:
        tokens = options.kv_capacity or options.max_context
        return -(-int(tokens) // options.page_size)
    floor = -(-options.max_context // options.page_size)
    if model.device.type != "cuda":
        # NOTE: no device memory to measure: every lane may hold a full-length sequence.
        return floor * options.max_concurrency
    free, _ = torch.cuda.mem_get_info(model.device)
    state = ModelCache.bytes_per_slot(config, dtype) * num_slots
    budget = free - state - workspace_bytes(config, options) - GIB
    # a quantized KV dtype shrinks the page (scales included), so the same budget holds more
    page_bytes = ModelCache.bytes_per_page(
        config, options.page_size, dtype, options.kv_dtype, extra_layers
    )
    pages = min(budget // page_bytes, MAX_PAGES)
    if pages < floor:
        raise ValueError(
            f"--kv-capacity auto: {max(budget, 0) / GIB:.1f} GiB left for KV after weights, "
            f"{num_slots} state slots and workspace; one {options.max_context}-token sequence "
            f"needs {floor} pages. Lower --max-concurrency, --device-state-slots or --max-context."
        )
    log.info(
        "kv-capacity auto: %d pages (%d tokens, kv dtype %s, %d bytes per token)",
        pages, pages * options.page_size, options.kv_dtype, page_bytes // options.page_size,
    )  # fmt: skip
    return int(pages)


def workspace_bytes(config: TextConfig, options: EngineOptions) -> int:
    """Activation memory beside weights, state and KV: a prefill chunk's largest intermediates
    (fp32 upper bound), decode logits for every lane (16 bytes a vocabulary entry: the bf16
    logits and two fp32 temporaries, the penalized ones of a verify), every verify column of
    it with spec (k + 1 per lane), and graph pools (512 MiB)."""
    width = max(config.intermediate_size, config.moe_intermediate_size * config.num_experts_per_tok)
    per_token = (8 * width + 8 * config.hidden_size) * 4
    logits = options.max_concurrency * (options.num_drafts + 1) * config.vocab_size * 16
    return options.prefill_chunk * per_token + logits + 512 * (1 << 20)


def _graph_status(model: Qwen3_5Model, wanted: bool, max_batch: int) -> str:
    """`on`, `off` (not wanted: CPU or no_cuda_graph) or `off: <why the model cannot>`."""
    if not wanted:
        return "off"
    reason = unsupported_reason(model, max_batch)
    return "on" if reason is None else f"off: {reason}"


def presets_of(generation: Mapping[str, Any], architecture: str) -> dict[str, SamplingPreset]:
    """The artifact's stored sampling presets, else the registered ones of its architecture."""
    stored = generation.get("presets")
    if isinstance(stored, Mapping) and THINKING in stored and NON_THINKING in stored:
        return {k: SamplingPreset(**stored[k]) for k in (THINKING, NON_THINKING)}
    return presets_for(architecture)
