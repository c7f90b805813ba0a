"""Engine options, named like the `ninfer serve` flags they come from."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from ninfer.engine.sampling import SamplingParams

KV_AUTO = "auto"  # --kv-capacity auto: size the KV pool from free device memory
MAX_CONCURRENCY = 64  # an extension of the spec's 1..8 (issue: up to 64 lanes)
# --kv-dtype names (the formats are kernels/kv_quant/formats.KV_DTYPES; spelled out here so that
# option checks import no torch; a test holds the two equal)
KV_DTYPES = ("bf16", "int8", "fp8", "nvfp4", "k8v4")
MAX_DRAFT_TOKENS = 5  # --draft-tokens for MTP: 1..5
DEFAULT_DRAFT_TOKENS = 3


@dataclass(frozen=True)
class EngineOptions:
    max_context: int = 8192
    kv_capacity: int | str | None = None  # tokens, "auto", or None (follows max_context)
    max_concurrency: int = 1  # 1..64
    max_batched_tokens: int | None = None  # per-step token budget; None: chunk + concurrency
    max_pending_requests: int = 16
    pending_timeout_ms: int = 30000
    prefill_chunk: int = 1024
    device_state_slots: int | None = None  # extra device StateImages; None: max_concurrency
    host_context_mib: int | None = None  # pinned host budget; None: 8192 MiB + 8 StateImages
    no_prefix_reuse: bool = False  # no cross-request prefix reads or writes
    page_size: int = 64
    dtype: str = "bf16"  # bf16 | fp32 (compute and KV dtype of the torch reference path)
    # KV-cache storage: bf16 (the compute dtype, unquantized), int8, fp8, nvfp4 or k8v4
    kv_dtype: str = "bf16"
    device: str = "cpu"  # cpu | cuda | cuda:N | auto (CUDA when a GPU is present)
    no_cuda_graph: bool = False  # decode eagerly instead of replaying CUDA graphs
    no_overlap: bool = False  # land each step before planning the next (no chained rounds)
    vision: bool = False  # load the vision tower and accept media (`ninfer serve --vision`)
    media_cache_mib: int = 1024  # LRU-retained prepared media (0: no retention)
    media_live_mib: int = 2048  # every live prepared media payload
    media_preprocess_threads: int = 0  # 0: min(16, host CPUs)
    allow_private_media_urls: bool = False  # let media URLs reach loopback / private networks
    vision_cache_mib: int = 256  # device memory for tower outputs of repeated media (0: off)
    spec: str | None = None  # speculative decoding backend: "mtp" (the artifact's MTP head)
    draft_tokens: int | None = None  # drafts per round, 1..5 (default 3 with spec="mtp")
    lm_head_draft: bool = False  # drafts read a 4-bit shortlist lm_head (needs spec)
    # tile-major copies of the decode GEMVs' weights (CUDA): faster decode, more weight memory
    decode_tiles: bool = False
    # process-level sampling overrides (spec: preset < process flag < request field; greedy last)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    greedy: bool = False

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineOptions:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"unknown engine option(s): {', '.join(unknown)}")
        return cls(**kwargs)

    def validate(self) -> None:
        def need(cond: bool, msg: str) -> None:
            if not cond:
                raise ValueError(msg)

        need(
            isinstance(self.max_concurrency, int) and 1 <= self.max_concurrency <= MAX_CONCURRENCY,
            f"max_concurrency must be in 1..{MAX_CONCURRENCY}",
        )
        need(self.max_context >= 2, "max_context must be at least 2")
        kv = self.kv_capacity
        need(
            kv is None or kv == KV_AUTO or (isinstance(kv, int) and kv >= 1),
            f"kv_capacity must be a positive number of tokens or 'auto', got {kv!r}",
        )
        need(
            self.max_batched_tokens is None or self.max_batched_tokens > self.max_concurrency,
            "max_batched_tokens must exceed max_concurrency (every decode row plus prefill)",
        )
        need(self.max_pending_requests >= 0, "max_pending_requests must be >= 0")
        need(self.pending_timeout_ms >= 1, "pending_timeout_ms must be positive")
        need(self.prefill_chunk >= 1, "prefill_chunk must be positive")
        need(
            self.device_state_slots is None or self.device_state_slots >= 0,
            "device_state_slots must be >= 0",
        )
        need(
            self.host_context_mib is None
            or (isinstance(self.host_context_mib, int) and self.host_context_mib >= 0),
            "host_context_mib must be >= 0",
        )
        need(self.dtype in ("bf16", "fp32"), "dtype must be bf16 or fp32")
        need(
            self.kv_dtype in KV_DTYPES,
            f"kv_dtype must be one of {'|'.join(KV_DTYPES)}, got {self.kv_dtype!r}",
        )
        need(self.media_cache_mib >= 0, "media_cache_mib must be >= 0")
        need(self.media_live_mib >= 1, "media_live_mib must be >= 1")
        need(self.media_preprocess_threads >= 0, "media_preprocess_threads must be >= 0")
        need(self.vision_cache_mib >= 0, "vision_cache_mib must be >= 0")
        need(
            _valid_device(self.device), f"device must be cpu, cuda, cuda:N or auto: {self.device!r}"
        )
        need(
            self.spec in (None, "mtp"),
            f"spec must be 'mtp' (dflash and dflash2 are not built), got {self.spec!r}",
        )
        need(
            self.draft_tokens is None
            or (isinstance(self.draft_tokens, int) and 1 <= self.draft_tokens <= MAX_DRAFT_TOKENS),
            f"draft_tokens must be in 1..{MAX_DRAFT_TOKENS}",
        )
        need(self.spec is not None or self.draft_tokens is None, "draft_tokens needs spec='mtp'")
        need(not self.lm_head_draft or self.spec is not None, "lm_head_draft needs spec='mtp'")
        need(not self.decode_tiles or self.device != "cpu", "decode_tiles needs a CUDA device")
        need(
            not self.decode_tiles or self.dtype == "bf16",
            "decode_tiles needs dtype bf16 (the fp32 path's GEMVs read rows)",
        )

    @property
    def num_drafts(self) -> int:
        """Drafts per speculative round; 0 without a speculative backend."""
        if self.spec is None:
            return 0
        return self.draft_tokens if self.draft_tokens is not None else DEFAULT_DRAFT_TOKENS

    @property
    def process_sampling(self) -> dict[str, Any]:
        """The sampler fields set on the command line (greedy is applied last, separately)."""
        keys = [f.name for f in fields(SamplingParams) if f.name != "greedy"]
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


def _valid_device(device: str) -> bool:
    if device in ("cpu", "cuda", "auto"):
        return True
    prefix, _, index = device.partition(":")
    return prefix == "cuda" and index.isdigit()


def resolve_device(device: str) -> str:
    """`auto` becomes cuda:0 when torch sees a GPU, else cpu; other names pass through."""
    if device != "auto":
        return device
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"
