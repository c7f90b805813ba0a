"""Exact prefix reuse: retained checkpoints, each a token prefix with its KV pages and StateImage.

No tensors. On this hybrid model a prefix is reusable only where a complete recurrent state was
captured at exactly its last token, so the index is a catalog of checkpoints, not of pages: a
checkpoint owns references to the KV pages covering its tokens (shared, by refcount, with the
sequences and other checkpoints whose prefix they are) and one StateImage. A lookup verifies
tokens exactly (a hash only labels evicted entries for the miss reason). Eviction is LRU; an
image that must leave the device spills to the host pool while its budget allows.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from ninfer.engine.kv_pool import PagePool
from ninfer.engine.plan import CopyOp
from ninfer.engine.state_images import StateImage, StateImages

MAX_GHOSTS = 64  # evicted checkpoints remembered (length, hash) for `miss=evicted`


@dataclass(eq=False)
class Checkpoint:
    """State after `tokens`: KV in `pages` (the last one possibly partly filled) and `image`."""

    tokens: tuple[int, ...]
    pages: list[int]
    image: StateImage

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class PrefixLookup:
    """A lookup's result: the checkpoint to start from, or why there is none.

    `miss` is None on a hit, else `diverged@N` (the longest stored prefix stops matching at
    token N), `evicted` (a checkpoint that matched was evicted), `no_candidate`, `disabled`, or
    `capacity` (the scheduler passed a matching checkpoint over: with it the prompt could not fit).
    """

    checkpoint: Checkpoint | None
    miss: str | None = None

    @property
    def hit(self) -> int:
        return self.checkpoint.length if self.checkpoint is not None else 0

    def header(self) -> str:
        """The `x-ninfer-prefix-cache` header value."""
        if self.checkpoint is not None:
            return f"hit={self.hit}; path=checkpoint"
        if self.miss is not None and self.miss.startswith("diverged@"):
            return f"hit=0; miss={self.miss}"
        return f"miss={self.miss}"


DISABLED = PrefixLookup(None, "disabled")


class PrefixCache:
    def __init__(self, pages: PagePool, images: StateImages) -> None:
        self.pages = pages
        self.images = images
        self._entries: dict[tuple[int, int], Checkpoint] = {}
        self._ghosts: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.version = 0  # bumped by every publish and eviction (lookups may be memoized)
        # counters (plain ints: the observability layer publishes them)
        self.num_lookups = 0
        self.num_hits = 0
        self.num_hit_tokens = 0
        self.num_published = 0
        self.num_evicted = 0

    @property
    def checkpoints(self) -> list[Checkpoint]:
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    # -- reads ---------------------------------------------------------------------------------
    def lookup(self, prompt: Sequence[int], *, whole: bool = False) -> PrefixLookup:
        """The longest checkpoint whose tokens are exactly a proper prefix of `prompt` (at least
        one prompt token is left to compute: its logits draw the first output token); with
        `whole`, the prefix may be all of `prompt` (a replay needs no logits)."""
        self.num_lookups += 1
        prompt = tuple(prompt)
        limit = len(prompt) + (1 if whole else 0)
        for ck in sorted(self._entries.values(), key=lambda c: -c.length):
            if ck.length < limit and prompt[: ck.length] == ck.tokens:
                return PrefixLookup(ck)
        return PrefixLookup(None, self._why_not(prompt))

    def use(self, ck: Checkpoint) -> None:
        """A request starts from `ck` (its restore copy is already in the plan)."""
        assert self.find(ck.tokens) is ck, "use of an evicted checkpoint"
        self.images.touch(ck.image)
        self.num_hits += 1
        self.num_hit_tokens += ck.length

    def _why_not(self, prompt: tuple[int, ...]) -> str:
        for length, key in reversed(self._ghosts):
            if length < len(prompt) and hash(prompt[:length]) == key:
                return "evicted"
        best = max((_common_prefix(prompt, c.tokens) for c in self._entries.values()), default=0)
        if 0 < best < len(prompt):
            return f"diverged@{best}"
        return "no_candidate"

    def find(self, tokens: Sequence[int]) -> Checkpoint | None:
        tokens = tuple(tokens)
        ck = self._entries.get((len(tokens), hash(tokens)))
        return ck if ck is not None and ck.tokens == tokens else None

    # -- writes --------------------------------------------------------------------------------
    def publish(
        self,
        tokens: Sequence[int],
        pages: Sequence[int],
        lane_slot: int,
        capture: list[CopyOp],
        copies: list[CopyOp],
        free_host: list[int],
    ) -> Checkpoint | None:
        """Retain `tokens` (KV in `pages`, state in `lane_slot` once every copy before the
        capture ran). The capture copy goes to `capture` (a row's after-forward copies, or the
        plan's copies); making room (spills) goes to `copies`. None when nothing has room."""
        tokens = tuple(tokens)
        assert len(pages) == self.pages.pages_for(len(tokens)) and tokens
        existing = self.find(tokens)
        if existing is not None:
            self.images.touch(existing.image)
            return existing
        device = self._room_for_image(copies, free_host)
        if device is None:
            return None
        image = self.images.capture(lane_slot, capture, device=device)
        if image is None:
            return None
        self.pages.retain(list(pages))
        ck = Checkpoint(tokens, list(pages), image)
        key = (len(tokens), hash(tokens))
        self._entries[key] = ck
        self._ghosts.pop(key, None)
        self.num_published += 1
        self.version += 1
        return ck

    def _room_for_image(self, copies: list[CopyOp], free_host: list[int]) -> bool | None:
        """Make room for one image: True (a device slot is free), False (the host has room), or
        None. Spills the least recently used device image to the host, evicting older host
        entries for room; drops it when the host cannot take it."""
        if self.images.num_free:
            return True
        on_device = sorted(
            (c for c in self._entries.values() if c.image.on_device),
            key=lambda c: c.image.last_used,
        )
        if on_device:
            victim = on_device[0]
            if not self._host_room(victim.image.last_used, free_host):
                self.evict(victim, free_host)
                return True
            spilled = self.images.spill(victim.image, copies)
            assert spilled
            return True
        if self._host_room(None, free_host):
            return False
        return None

    def host_room(self, need: int, free_host: list[int]) -> bool:
        """Evict host-resident checkpoints (least recent first) until `need` bytes of the host
        pool are free; evicts nothing when even all of them would not be enough."""
        host = self.images.host
        held = sum(self.images.image_bytes for c in self._entries.values() if not c.image.on_device)
        if host.num_free_bytes >= need or host.num_free_bytes + held < need:
            return host.num_free_bytes >= need
        for ck in sorted(self._entries.values(), key=lambda c: c.image.last_used):
            if host.num_free_bytes >= need:
                break
            if not ck.image.on_device:
                self.evict(ck, free_host)
        return host.num_free_bytes >= need

    def _host_room(self, older_than: int | None, free_host: list[int]) -> bool:
        """Evict host-resident entries (least recent first, only those used before
        `older_than` when given) until one image fits in the host pool."""
        need = self.images.image_bytes
        host = sorted(
            (c for c in self._entries.values() if not c.image.on_device),
            key=lambda c: c.image.last_used,
        )
        for ck in host:
            if self.images.host.num_free_bytes >= need:
                break
            if older_than is not None and ck.image.last_used > older_than:
                break
            self.evict(ck, free_host)
        return self.images.host.num_free_bytes >= need

    def evict(self, ck: Checkpoint, free_host: list[int]) -> None:
        key = (ck.length, hash(ck.tokens))
        assert self._entries.get(key) is ck
        del self._entries[key]
        self.pages.release(ck.pages)
        self.images.release(ck.image, free_host)
        self._ghosts[key] = None
        while len(self._ghosts) > MAX_GHOSTS:
            self._ghosts.popitem(last=False)
        self.num_evicted += 1
        self.version += 1

    def clear(self, free_host: list[int]) -> None:
        for ck in list(self._entries.values()):
            self.evict(ck, free_host)

    # -- page pressure -------------------------------------------------------------------------
    def reclaimable_pages(self, keep: Checkpoint | None = None) -> int:
        """Pages that evicting every checkpoint but `keep` would return to the free list."""
        refs: dict[int, int] = {}
        for ck in self._entries.values():
            if ck is not keep:
                for p in ck.pages:
                    refs[p] = refs.get(p, 0) + 1
        return sum(1 for p, n in refs.items() if self.pages.refcount(p) == n)

    def reclaim(self, need: int, free_host: list[int], keep: Checkpoint | None = None) -> bool:
        """Evict least recently used checkpoints (never `keep`) until `need` pages are free;
        evicts nothing (and returns False) when evicting all of them would not be enough."""
        if self.pages.num_free >= need:
            return True
        if self.pages.num_free + self.reclaimable_pages(keep) < need:
            return False
        while self.pages.num_free < need:
            # least recently used first, among those whose eviction frees a page now (a page
            # shared only by checkpoints frees once the last of them goes)
            lru = sorted((c for c in self._entries.values() if c is not keep),
                         key=lambda c: c.image.last_used)  # fmt: skip
            frees = [c for c in lru if any(self.pages.refcount(p) == 1 for p in c.pages)]
            self.evict((frees or lru)[0], free_host)
        return True

    # -- integrity -----------------------------------------------------------------------------
    def page_owners(self) -> list[list[int]]:
        return [ck.pages for ck in self._entries.values()]

    def image_owners(self) -> list[StateImage]:
        return [ck.image for ck in self._entries.values()]

    def check_integrity(self) -> None:
        for key, ck in self._entries.items():
            assert key == (ck.length, hash(ck.tokens)), "a checkpoint under the wrong key"
            assert len(ck.pages) == self.pages.pages_for(ck.length), "checkpoint pages"


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """Length of the longest common prefix (64-token slices first, then token by token)."""
    n = min(len(a), len(b))
    i = 0
    while i + 64 <= n and a[i : i + 64] == b[i : i + 64]:
        i += 64
    while i < n and a[i] == b[i]:
        i += 1
    return i
