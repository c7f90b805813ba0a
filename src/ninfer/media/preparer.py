"""MediaPreparer: sources -> leased PreparedMedia, through the cache and a bounded worker pool.

Imports media.* only. Acquisition (data URI decoding, safe http fetch) and cache-miss builds
(decode -> resize -> pack) run as independent tasks on one bounded pool; the caller's thread does
all waiting (single-flight joins included), so pool workers never block on each other. A request
holds a MediaLease until its generation ends; releasing it returns the live bytes the cache no
longer retains.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar

import torch

from ninfer.media.cache import Claim, MediaCache
from ninfer.media.errors import MEDIA_BUDGET_EXCEEDED, MediaError
from ninfer.media.fetch import FetchPolicy, fetch
from ninfer.media.image import decode_image, preprocess_image
from ninfer.media.prepared import PreparedMedia
from ninfer.media.settings import MediaSettings
from ninfer.media.sources import MediaSource, decode_data_uri, is_http_url
from ninfer.media.video import decode_video, preprocess_video

T = TypeVar("T")
# The vision runtime's envelope per request (spec: 32,768 merged tokens, 131,072 raw patches).
MAX_REQUEST_TOKENS = 32768


@dataclass(frozen=True)
class MediaLimits:
    cache_mib: int = 1024  # --media-cache-mib (0: no retention)
    live_mib: int = 2048  # --media-live-mib
    threads: int = 0  # --media-preprocess-threads (0: min(16, host CPUs))
    max_request_tokens: int = MAX_REQUEST_TOKENS
    fetch: FetchPolicy = FetchPolicy()


class MediaLease:
    """The payloads one request holds; `release` is idempotent."""

    def __init__(self, cache: MediaCache, items: Sequence[PreparedMedia]) -> None:
        self.items = tuple(items)
        self._cache = cache
        self._released = False
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        for item in self.items:
            self._cache.release(item)


class MediaPreparer:
    def __init__(
        self, settings: MediaSettings, *, dtype: torch.dtype, limits: MediaLimits = MediaLimits()
    ) -> None:
        self.settings = settings
        self.dtype = dtype
        self.limits = limits
        self.cache = MediaCache(limits.cache_mib << 20, limits.live_mib << 20)
        threads = limits.threads or min(16, os.cpu_count() or 1)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ninfer-media")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- one item -------------------------------------------------------------------------------
    def _acquire(self, src: MediaSource) -> bytes:
        policy = self.limits.fetch
        if src.url.startswith("data:"):
            return decode_data_uri(src.url, policy.max_bytes)
        if is_http_url(src.url):
            return fetch(src.url, policy)
        raise MediaError(
            f"unsupported {src.kind} source {src.url[:60]!r} (use an http(s) or data URI)"
        )

    def _build(self, src: MediaSource, data: bytes, digest: str) -> PreparedMedia:
        if src.kind == "image":
            prepared = preprocess_image(decode_image(data), self.settings.image, dtype=self.dtype)
        else:
            video = self.settings.video
            prepared = preprocess_video(decode_video(data, video), video, dtype=self.dtype)
        return replace(prepared, digest=digest, source_bytes=len(data))

    def _build_task(self, src: MediaSource, data: bytes, claim: Claim) -> None:
        try:
            payload = self._build(src, data, claim.key[0])
        except BaseException as e:  # reaches the waiters through the future
            self.cache.finish(claim, None, e)
        else:
            self.cache.finish(claim, payload, None)

    # -- a request ------------------------------------------------------------------------------
    def prepare(self, sources: Sequence[MediaSource]) -> MediaLease:
        """Every source prepared (in order) and leased; errors name the failing item."""
        acquired = [self._pool.submit(self._acquire, s) for s in sources]
        slots: list[PreparedMedia | None] = [None] * len(sources)
        waits: list[tuple[int, Claim, Future[PreparedMedia], bool]] = []
        try:
            for i, src in enumerate(sources):
                data = _result(acquired[i], src)
                claim = self.cache.claim((hashlib.sha256(data).hexdigest(), src.kind))
                if claim.payload is not None:
                    slots[i] = claim.payload
                elif claim.build is not None:
                    self._pool.submit(self._build_task, src, data, claim)
                    waits.append((i, claim, claim.build, True))
                else:
                    assert claim.wait is not None
                    waits.append((i, claim, claim.wait, False))
            for i, claim, future, own in waits:
                payload = _result(future, sources[i])
                slots[i] = payload if own else self.cache.join(claim, payload)
        except BaseException:
            for fut in acquired:
                fut.cancel()
            for item in slots:
                if item is not None:
                    self.cache.release(item)
            for i, _, future, own in waits:  # own builds not yet collected: drop on completion
                if own and slots[i] is None:
                    future.add_done_callback(_release_when_done(self.cache))
            raise
        items = [m for m in slots if m is not None]
        lease = MediaLease(self.cache, items)
        tokens = sum(m.num_tokens for m in items)
        if tokens > self.limits.max_request_tokens:
            lease.release()
            raise MediaError(
                f"the request's media need {tokens} vision tokens, more than the "
                f"{self.limits.max_request_tokens} one request may use",
                code=MEDIA_BUDGET_EXCEEDED,
            )
        return lease


def _release_when_done(cache: MediaCache) -> Callable[[Future[PreparedMedia]], None]:
    def done(future: Future[PreparedMedia]) -> None:
        if future.exception() is None:
            cache.release(future.result())

    return done


def _result(future: Future[T], src: MediaSource) -> T:
    try:
        return future.result()
    except MediaError as e:
        raise e.at(src.param) from None
