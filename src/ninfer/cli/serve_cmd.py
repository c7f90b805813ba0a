"""`ninfer serve`: parse the serve flags, refuse the ones not built yet, hand over to server.run.

Flags of the spec's table that this version cannot honour are still parsed, so a command line
written for the full product fails with one clear line naming the flag (exit 2), never "no such
option" or a silently ignored setting.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ninfer.cli.common import resolve_artifact
from ninfer.cli.errors import UserError

LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "critical", "off")


def _opt(default: object, *names: str, help: str, **kw: object) -> object:
    return typer.Option(default, *names, help=help, show_default=default is not None, **kw)


def serve(
    artifact: Path | None = typer.Argument(None, help="Artifact (.ninfer); the demo when omitted."),
    host: str = _opt("127.0.0.1", "--host", help="Listen address."),
    port: int = _opt(8080, "--port", help="Listen port.", min=0, max=65535),
    api_key: str | None = _opt(None, "--api-key", help="Required bearer / x-api-key value."),
    model_id: str | None = _opt(None, "--model-id", help="Public model id (default: artifact)."),
    max_context: int = _opt(8192, "--max-context", help="Context ceiling per sequence.", min=2),
    kv_capacity: str | None = _opt(None, "--kv-capacity", help="KV pool tokens (N|auto)."),
    max_concurrency: int = _opt(
        1,
        "--max-concurrency",
        help="Execution lanes, 1..64 (an extension of the spec's 1..8).",
        min=1,
        max=64,
    ),
    max_batched_tokens: int | None = _opt(
        None, "--max-batched-tokens", help="Tokens per step (default: chunk + lanes).", min=2
    ),
    max_pending: int = _opt(16, "--max-pending-requests", help="Waiting requests.", min=0),
    pending_timeout_ms: int = _opt(30000, "--pending-timeout-ms", help="Admission wait.", min=1),
    prefill_chunk: int = _opt(1024, "--prefill-chunk", help="Prefill chunk tokens.", min=1),
    device_state_slots: int | None = _opt(
        None, "--device-state-slots", help="Device StateImages beyond the lanes.", min=0
    ),
    max_request_mib: int = _opt(384, "--max-request-mib", help="Body size limit.", min=1),
    default_max_tokens: int = _opt(8192, "--default-max-tokens", help="Output limit.", min=0),
    no_thinking: bool = _opt(False, "--no-thinking", help="Thinking off by default."),
    preserve_thinking: bool = _opt(False, "--preserve-thinking", help="Keep past reasoning."),
    cors: bool = _opt(False, "--cors", help="Permissive browser CORS headers."),
    temperature: float | None = _opt(None, "--temperature", help="Override.", min=0.0, max=2.0),
    top_p: float | None = _opt(None, "--top-p", help="Override.", min=0.0, max=1.0),
    top_k: int | None = _opt(None, "--top-k", help="Override (0..20).", min=0, max=20),
    min_p: float | None = _opt(None, "--min-p", help="Override.", min=0.0, max=1.0),
    presence_penalty: float | None = _opt(
        None, "--presence-penalty", help="Override.", min=-2.0, max=2.0
    ),
    frequency_penalty: float | None = _opt(
        None, "--frequency-penalty", help="Override.", min=-2.0, max=2.0
    ),
    seed: int | None = _opt(None, "--seed", help="Seed when a request omits one."),
    greedy: bool = _opt(False, "--greedy", help="Force argmax for all requests."),
    log_level: str = _opt("info", "--log-level", help="|".join(LOG_LEVELS)),
    dtype: str = _opt("bf16", "--dtype", help="bf16|fp32 compute dtype."),
    device: str | None = _opt(None, "--device", help="CUDA index N, or cpu (default: auto)."),
    chat_template: Path | None = _opt(None, "--chat-template", help="Jinja template file."),
    no_cuda_graph: bool = _opt(False, "--no-cuda-graph", help="Decode without CUDA graphs."),
    no_prefix_reuse: bool = _opt(False, "--no-prefix-reuse", help="No cross-request reuse."),
    log_stats_interval_ms: int | None = _opt(None, "--log-stats-interval-ms", help="Not built."),
    kv_dtype: str | None = _opt(None, "--kv-dtype", help="Only bf16 is built."),
    spec: str | None = _opt(None, "--spec", help="Not built."),
    draft_tokens: int | None = _opt(None, "--draft-tokens", help="Not built."),
    lm_head_draft: bool = _opt(False, "--lm-head-draft", help="Not built."),
    vision: bool = _opt(False, "--vision", help="Not built."),
    request_log_jsonl: Path | None = _opt(None, "--request-log-jsonl", help="Not built."),
    default_thinking_budget: int | None = _opt(
        None, "--default-thinking-budget", help="Thinking-token cap (thinking mode).", min=1
    ),
    host_context_mib: int | None = _opt(
        None, "--host-context-mib", help="Pinned host MiB (default 8192 + 8 images).", min=0
    ),
    context_cost_presets: Path | None = _opt(None, "--context-cost-presets", help="Not built."),
    media_cache_mib: int | None = _opt(None, "--media-cache-mib", help="Not built."),
    media_live_mib: int | None = _opt(None, "--media-live-mib", help="Not built."),
    media_threads: int | None = _opt(None, "--media-preprocess-threads", help="Not built."),
    store_records: int = _opt(
        1024, "--response-store-max-records", help="Stored Responses (LRU).", min=1
    ),
    store_mib: int = _opt(256, "--response-store-max-mib", help="Response store MiB.", min=1),
) -> None:
    """Serve the OpenAI Chat Completions API over one resident engine."""
    not_built = {
        "--spec": spec is not None,
        "--draft-tokens": draft_tokens is not None,
        "--lm-head-draft": lm_head_draft,
        "--vision": vision,
        "--kv-dtype": kv_dtype not in (None, "bf16"),
        "--request-log-jsonl": request_log_jsonl is not None,
        "--context-cost-presets": context_cost_presets is not None,
        "--media-cache-mib": media_cache_mib is not None,
        "--media-live-mib": media_live_mib is not None,
        "--media-preprocess-threads": media_threads is not None,
        "--log-stats-interval-ms": log_stats_interval_ms not in (None, 0),
    }
    for flag, given in not_built.items():
        if given:
            raise UserError(f"{flag} is not supported yet in this version of ninfer serve")
    if log_level not in LOG_LEVELS:
        raise UserError(f"--log-level must be one of {', '.join(LOG_LEVELS)}")
    if dtype not in ("bf16", "fp32"):
        raise UserError("--dtype must be bf16 or fp32")
    if kv_capacity not in (None, "auto") and (not kv_capacity.isdigit() or int(kv_capacity) < 1):
        raise UserError("--kv-capacity must be a positive token count or auto")
    from ninfer.server.config import ServerConfig
    from ninfer.server.run import serve as run_server

    config = ServerConfig(
        host=host,
        port=port,
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
    )
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
        "max_pending_requests": max_pending,
        "pending_timeout_ms": pending_timeout_ms,
        "prefill_chunk": prefill_chunk,
        "device_state_slots": device_state_slots,
        "host_context_mib": host_context_mib,
        "no_prefix_reuse": no_prefix_reuse,
        "dtype": dtype,
        "device": _device(device),
        "no_cuda_graph": no_cuda_graph,
        "greedy": greedy,
        **{k: v for k, v in sampling.items() if v is not None},
    }
    from ninfer.engine.options import EngineOptions

    try:
        EngineOptions.from_kwargs(**engine_options).validate()
    except ValueError as e:
        raise UserError(str(e)) from None
    run_server(
        resolve_artifact(artifact),
        config,
        engine_options,
        log_level=log_level,
        chat_template=chat_template,
    )


def _device(device: str | None) -> str:
    if device == "cpu":
        return "cpu"
    if device is not None and not device.isdigit():
        raise UserError("--device must be a CUDA device index or cpu")
    import torch

    if device is None:
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        raise UserError(f"--device {device}: no CUDA device is available")
    return f"cuda:{device}"
