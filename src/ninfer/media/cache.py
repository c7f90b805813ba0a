"""The prepared-media cache: SHA-256-keyed LRU, live-byte accounting and single-flight builds.

Imports the standard library and media.prepared only; thread-safe (one lock). A payload is
*retained* while the LRU holds it (bounded by `cache_bytes`) and *live* while the LRU or any
lease holds it; all live bytes stay within `live_bytes`. Eviction never invalidates a lease: the
bytes leave the live account only when the last holder lets go. Concurrent misses of one key share
one build (the first caller builds, the others wait on its future).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass, field

from ninfer.media.errors import MEDIA_BUDGET_EXCEEDED, MediaError
from ninfer.media.prepared import PreparedMedia

Key = tuple[str, str]  # (sha256 hex of the source bytes, modality)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    single_flight_waits: int = 0  # misses served by another caller's build
    builds: int = 0
    evictions: int = 0
    rejected: int = 0  # builds refused by the live budget


@dataclass
class _Entry:
    payload: PreparedMedia
    leases: int = 0
    retained: bool = False


@dataclass
class Claim:
    """What `claim` hands back: a payload (hit), a future to wait on, or the duty to build."""

    key: Key
    payload: PreparedMedia | None = None
    wait: Future[PreparedMedia] | None = None
    build: Future[PreparedMedia] | None = field(default=None)


class MediaCache:
    def __init__(self, cache_bytes: int, live_bytes: int) -> None:
        if cache_bytes < 0 or live_bytes <= 0:
            raise ValueError("media cache budgets must be >= 0 (cache) and > 0 (live)")
        self.cache_bytes = cache_bytes
        self.live_limit = live_bytes
        self._lock = threading.Lock()
        self._entries: dict[Key, _Entry] = {}
        self._lru: OrderedDict[Key, None] = OrderedDict()
        self._inflight: dict[Key, Future[PreparedMedia]] = {}
        self.retained_bytes = 0
        self.live_bytes = 0
        self.stats = CacheStats()

    # -- lookups ---------------------------------------------------------------------------------
    def claim(self, key: Key) -> Claim:
        """A hit takes a lease at once; a miss either joins an in-flight build or owns one."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self.stats.hits += 1
                return Claim(key, payload=self._lease(key, entry))
            self.stats.misses += 1
            future = self._inflight.get(key)
            if future is not None:
                self.stats.single_flight_waits += 1
                return Claim(key, wait=future)
            future = Future()
            self._inflight[key] = future
            return Claim(key, build=future)

    def finish(
        self, claim: Claim, payload: PreparedMedia | None, error: BaseException | None
    ) -> None:
        """The builder of `claim` reports: the payload enters the account (leased once for the
        builder) or the error reaches every waiter."""
        assert claim.build is not None
        with self._lock:
            del self._inflight[claim.key]
            entry = self._entries.get(claim.key)
            if error is None and entry is not None:
                # a late waiter of an earlier build of this key re-admitted the same bytes while
                # this one ran: lease that entry (never overwrite it, see `join`)
                payload = self._lease(claim.key, entry)
            elif error is None and payload is not None:
                error = self._admit(claim.key, payload)
            if error is None:
                self.stats.builds += 1
        if error is not None:
            claim.build.set_exception(error)
        else:
            claim.build.set_result(payload)  # type: ignore[arg-type]

    def join(self, claim: Claim, payload: PreparedMedia) -> PreparedMedia:
        """A waiter of an in-flight build takes its own lease on the built payload.

        By the time the waiter wakes, the build may already be gone (released by everyone with the
        cache off or evicted) and a later build of the same key may have taken its place. The
        waiter then leases the entry that is there, the same bytes under the same digest, rather
        than overwriting it: an overwritten entry's bytes would stay live with no holder able to
        release them."""
        with self._lock:
            entry = self._entries.get(claim.key)
            if entry is None:
                error = self._admit(claim.key, payload)
                if error is not None:
                    raise error
                return payload
            return self._lease(claim.key, entry)

    def release(self, payload: PreparedMedia) -> None:
        key = (payload.digest, payload.modality)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.payload is not payload or entry.leases <= 0:
                return
            entry.leases -= 1
            if entry.leases == 0 and not entry.retained:
                self._drop(key)

    # -- accounting (lock held) -----------------------------------------------------------------
    def _lease(self, key: Key, entry: _Entry) -> PreparedMedia:
        """One more holder of an entry already accounted for; a retained one is now the most
        recently used."""
        entry.leases += 1
        if entry.retained:
            self._lru.move_to_end(key)
        return entry.payload

    def _admit(self, key: Key, payload: PreparedMedia) -> MediaError | None:
        size = payload.nbytes
        while self.live_bytes + size > self.live_limit and self._evict_one(unleased_only=True):
            pass
        if self.live_bytes + size > self.live_limit:
            self.stats.rejected += 1
            return MediaError(
                f"prepared media of {size} bytes does not fit the live media budget "
                f"({self.live_bytes} of {self.live_limit} bytes in use)",
                code=MEDIA_BUDGET_EXCEEDED,
            )
        entry = _Entry(payload, leases=1)
        self._entries[key] = entry
        self.live_bytes += size
        if 0 < size <= self.cache_bytes:
            entry.retained = True
            self._lru[key] = None
            self.retained_bytes += size
            while self.retained_bytes > self.cache_bytes and self._evict_one(unleased_only=False):
                pass
        return None

    def _evict_one(self, *, unleased_only: bool) -> bool:
        for key in self._lru:
            entry = self._entries[key]
            if unleased_only and entry.leases:
                continue
            del self._lru[key]
            entry.retained = False
            self.retained_bytes -= entry.payload.nbytes
            self.stats.evictions += 1
            if entry.leases == 0:
                self._drop(key)
            return True
        return False

    def _drop(self, key: Key) -> None:
        entry = self._entries.pop(key)
        self.live_bytes -= entry.payload.nbytes

    # -- views ------------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {
                "entries": len(self._entries),
                "retained": len(self._lru),
                "retained_bytes": self.retained_bytes,
                "live_bytes": self.live_bytes,
                "inflight": len(self._inflight),
                **vars(self.stats),
            }
