"""`ninfer serve`: parse the serve flags, check everything that can fail, hand over to server.run.

Flags of the spec's table that this version cannot honour are still parsed (hidden from help), so
a command line written for the full product fails with one clear line naming the flag (exit 2),
never "no such option" or a silently ignored setting. Files, the device and the listen socket are
checked before the model loads.
"""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path
from typing import Any

import typer

from ninfer.cli import options as o
from ninfer.cli.checks import (
    check_artifact_path,
    check_engine_options,
    check_sampling,
    load_template,
)
from ninfer.cli.common import load_engine, resolve_artifact
from ninfer.cli.device import check_device, parse_device
from ninfer.cli.errors import UserError
from ninfer.cli.listen import bind_listener
from ninfer.cli.options import hidden, opt
from ninfer.server.config import DEFAULT_MAX_REQUEST_MIB, ServerConfig
from ninfer.server.request_log import RequestLogError, check_path

LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical", "off")


def serve(
    ctx: typer.Context,
    artifact: Path | None = o.artifact_argument(),
    host: str = opt("127.0.0.1", "--host", help="Listen address.", metavar="HOST"),
    port: int = opt(
        8080, "--port", help="Listen port (0: any free port).", metavar="N", min=0, max=65535
    ),
    api_key: str | None = opt(
        None, "--api-key", help="Required bearer / x-api-key value.", metavar="KEY"
    ),
    model_id: str | None = opt(
        None,
        "--model-id",
        help="Public model id (default: the artifact's name; also --served-model-name).",
        metavar="ID",
    ),
    max_context: int = o.max_context(8192),
    kv_capacity: str | None = opt(
        None, "--kv-capacity", help="KV pool tokens (default: --max-context).", metavar="N|auto"
    ),
    max_concurrency: int = opt(
        1,
        "--max-concurrency",
        help="Execution lanes, 1..64: an extension of the spec's 1..8 (also --max-num-seqs).",
        metavar="N",
        min=1,
        max=64,
    ),
    max_batched_tokens: int | None = opt(
        None,
        "--max-batched-tokens",
        help="Tokens per step (default: --prefill-chunk + --max-concurrency).",
        metavar="N",
        min=2,
    ),
    max_pending: int = opt(
        16, "--max-pending-requests", help="Requests waiting for a lane.", metavar="N", min=0
    ),
    pending_timeout_ms: int = opt(
        30000, "--pending-timeout-ms", help="Admission wait.", metavar="MS", min=1
    ),
    prefill_chunk: int = opt(
        1024, "--prefill-chunk", help="Prefill chunk tokens.", metavar="N", min=1
    ),
    device_state_slots: int | None = opt(
        None, "--device-state-slots", help="Extra state slots.", metavar="N", min=0
    ),
    max_request_mib: int = opt(
        DEFAULT_MAX_REQUEST_MIB,
        "--max-request-mib",
        help="Body size limit (fits 1 + 16 worst-case bodies in ~4 GiB).",
        metavar="MIB",
        min=1,
    ),
    default_max_tokens: int = opt(
        8192,
        "--default-max-tokens",
        help="Output limit when a request sets none.",
        metavar="N",
        min=0,
    ),
    no_thinking: bool = o.no_thinking("Thinking off by default."),
    preserve_thinking: bool = opt(False, "--preserve-thinking", help="Keep past reasoning."),
    cors: bool = opt(False, "--cors", help="Permissive browser CORS headers."),
    temperature: float | None = o.temperature(),
    top_p: float | None = o.top_p(),
    top_k: int | None = o.top_k(),
    min_p: float | None = o.min_p(),
    presence_penalty: float | None = o.presence_penalty(),
    frequency_penalty: float | None = o.frequency_penalty(),
    seed: int | None = o.seed("Seed when a request omits one."),
    greedy: bool = o.greedy("Force argmax for all requests."),
    log_level: str = opt(
        "info", "--log-level", help=f"Stderr verbosity: {', '.join(LOG_LEVELS)}.", metavar="LEVEL"
    ),
    dtype: str = o.dtype(),
    device: str = o.device(),
    chat_template: Path | None = o.chat_template(),
    no_cuda_graph: bool = opt(False, "--no-cuda-graph", help="Decode without CUDA graphs."),
    no_prefix_reuse: bool = opt(False, "--no-prefix-reuse", help="No cross-request reuse."),
    log_stats_interval_ms: int = opt(
        5000,
        "--log-stats-interval-ms",
        help="Throughput record interval; 0: off.",
        metavar="MS",
        min=0,
    ),
    kv_dtype: str = o.kv_dtype(),
    spec: str | None = o.spec(),
    draft_tokens: int | None = o.draft_tokens(),
    lm_head_draft: bool = o.lm_head_draft(),
    decode_tiles: bool = o.decode_tiles(),
    vision: bool = opt(False, "--vision", help="Load the vision tower; accept images/video."),
    request_log_jsonl: Path | None = opt(
        None, "--request-log-jsonl", help="Append JSONL request records to FILE.", metavar="FILE"
    ),
    default_thinking_budget: int | None = opt(
        None,
        "--default-thinking-budget",
        help="Thinking-token cap (thinking mode).",
        metavar="N",
        min=1,
    ),
    host_context_mib: int | None = opt(
        None,
        "--host-context-mib",
        help="Pinned host budget for StateImages and snapshots (default 8192 + 8 images).",
        metavar="MIB",
        min=0,
    ),
    context_cost_presets: Path | None = hidden(None, "--context-cost-presets"),
    media_cache_mib: int = opt(
        1024, "--media-cache-mib", help="Retained prepared media.", metavar="MIB", min=0
    ),
    media_live_mib: int = opt(
        2048, "--media-live-mib", help="All live prepared media.", metavar="MIB", min=1
    ),
    media_threads: int = opt(
        0, "--media-preprocess-threads", help="Media workers (0: auto).", metavar="N", min=0
    ),
    allow_private_media_urls: bool = opt(
        False, "--allow-private-media-urls", help="Let media URLs reach private networks."
    ),
    store_records: int = opt(
        1024, "--response-store-max-records", help="Stored Responses (LRU).", metavar="N", min=1
    ),
    max_model_len: int | None = o.max_model_len(),
    served_model_name: str | None = o.alias("--served-model-name"),
    max_num_seqs: int | None = o.alias("--max-num-seqs", min=1, max=64),
    store_mib: int = opt(
        256, "--response-store-max-mib", help="Response store size.", metavar="MIB", min=1
    ),
) -> None:
    """Serve OpenAI Chat Completions, OpenAI Responses and Anthropic Messages over one model.

    One resident engine answers, streaming or not:
      /v1/chat/completions   OpenAI Chat Completions
      /v1/responses          OpenAI Responses
      /v1/messages           Anthropic Messages
    plus token counting, /v1/models and /health (docs/serving.md).
    Flags, files, the device and the listen address are checked before the model loads.
    """
    speculative = o.spec_options("serve", spec, draft_tokens, lm_head_draft)
    not_built = {
        "--context-cost-presets": context_cost_presets is not None,
    }
    for flag, given in not_built.items():
        if given:
            raise UserError(f"{flag} is not supported yet in this version of ninfer serve")
    max_context = o.merge_alias(ctx, "max_context", max_context, "--max-model-len", max_model_len)
    model_id = o.merge_alias(ctx, "model_id", model_id, "--served-model-name", served_model_name)
    max_concurrency = o.merge_alias(
        ctx, "max_concurrency", max_concurrency, "--max-num-seqs", max_num_seqs
    )
    if log_level not in LOG_LEVELS:
        raise UserError(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
    if dtype not in ("bf16", "fp32"):
        raise UserError("--dtype must be bf16 or fp32")
    if kv_capacity not in (None, "auto") and (not kv_capacity.isdigit() or int(kv_capacity) < 1):
        raise UserError("--kv-capacity must be a positive token count or auto")
    sampling = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "presence_penalty": presence_penalty,
        "frequency_penalty": frequency_penalty,
        "seed": seed,
    }
    engine_options = {
        "max_context": max_context,
        "kv_capacity": int(kv_capacity) if kv_capacity and kv_capacity.isdigit() else kv_capacity,
        "max_concurrency": max_concurrency,
        "max_batched_tokens": max_batched_tokens,
        "host_context_mib": host_context_mib,
        "no_prefix_reuse": no_prefix_reuse,
        "max_pending_requests": max_pending,
        "pending_timeout_ms": pending_timeout_ms,
        "prefill_chunk": prefill_chunk,
        "device_state_slots": device_state_slots,
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "device": parse_device(device),
        "no_cuda_graph": no_cuda_graph,
        "greedy": greedy,
        "vision": vision,
        "media_cache_mib": media_cache_mib,
        "media_live_mib": media_live_mib,
        "media_preprocess_threads": media_threads,
        "allow_private_media_urls": allow_private_media_urls,
        **speculative,
        **({"decode_tiles": True} if decode_tiles else {}),
        **{k: v for k, v in sampling.items() if v is not None},
    }
    check_sampling(sampling)
    check_engine_options(engine_options)
    check_artifact_path(artifact)
    if chat_template is not None:
        load_template(chat_template)
    engine_options["device"] = check_device(engine_options["device"])
    check_engine_options(engine_options)  # again with `auto` resolved (--decode-tiles on the CPU)
    if request_log_jsonl is not None:  # before the model loads: a bad path fails at once
        try:
            check_path(request_log_jsonl, resolve_artifact(artifact))
        except RequestLogError as e:
            raise UserError(str(e)) from None
    sock = bind_listener(host, port)
    try:
        config = ServerConfig(
            host=host,
            port=sock.getsockname()[1],
            model_id=model_id,
            api_key=api_key,
            cors=cors,
            max_request_mib=max_request_mib,
            default_max_tokens=default_max_tokens,
            no_thinking=no_thinking,
            preserve_thinking=preserve_thinking,
            default_thinking_budget=default_thinking_budget,
            response_store_max_records=store_records,
            response_store_max_mib=store_mib,
            request_log_jsonl=str(request_log_jsonl) if request_log_jsonl is not None else None,
            log_stats_interval_ms=log_stats_interval_ms,
            argv=tuple(sys.argv),
        )
        _run(artifact, config, engine_options, log_level, chat_template, sock)
    finally:
        sock.close()


def _run(
    artifact: Path | None,
    config: ServerConfig,
    engine_options: dict[str, Any],
    log_level: str,
    chat_template: Path | None,
    sock: socket.socket,
) -> None:
    from ninfer.server.logs import configure_logging
    from ninfer.server.run import serve as run_server

    configure_logging(log_level)
    log = logging.getLogger("ninfer.server")

    def captured(rows: int, pages_wide: int, seconds: float) -> None:
        log.info(
            "captured the CUDA graph of decode batch %d (%d KV pages wide) in %.0f ms",
            rows, pages_wide, seconds * 1000,
        )  # fmt: skip

    def load(path: Path, options: dict[str, Any]) -> Any:
        try:
            return load_engine(
                path, options, emit=log.info, announce=False, on_graph_capture=captured
            )
        except ValueError as e:  # the engine's refusal of an option (no such device, ...)
            raise UserError(str(e)) from None

    run_server(
        resolve_artifact(artifact, emit=log.info),
        config,
        engine_options,
        log_level=log_level,
        chat_template=chat_template,
        sock=sock,
        load=load,
    )
