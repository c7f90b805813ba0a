"""The Main Text KV page pool: a free list and refcounts, no policy.

Pages are the unit of KV storage for every full-attention layer (64 tokens by default). A page may
be shared (running sequences and retained prefix checkpoints hold references to the same page),
so it returns to the free list only when its last reference drops.
The pool never touches device memory; `model.cache.ModelCache` owns the tensors these ids index.
"""

from __future__ import annotations

from collections import deque


class PagePool:
    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError("a page pool needs at least one page of at least one token")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: deque[int] = deque(range(num_pages))
        self._refs = [0] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def allocate(self, n: int) -> list[int] | None:
        """n fresh pages with refcount 1, or None (and no change) when fewer than n are free."""
        if n > len(self._free):
            return None
        out = [self._free.popleft() for _ in range(n)]
        for p in out:
            self._refs[p] = 1
        return out

    def retain(self, pages: list[int]) -> None:
        for p in pages:
            assert self._refs[p] > 0, f"retain of free page {p}"
            self._refs[p] += 1

    def release(self, pages: list[int]) -> None:
        for p in pages:
            assert self._refs[p] > 0, f"double release of page {p}"
            self._refs[p] -= 1
            if self._refs[p] == 0:
                self._free.append(p)

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def check_integrity(self, owners: list[list[int]] | None = None) -> None:
        """Every page is either free with refcount 0 or in use with a positive count; with
        `owners` (every holder's page list), each refcount equals the number of holders."""
        free = set(self._free)
        assert len(free) == len(self._free), "a page is on the free list twice"
        for p, r in enumerate(self._refs):
            assert (p in free) == (r == 0), f"page {p}: refcount {r}, free={p in free}"
        if owners is not None:
            counts = [0] * self.num_pages
            for pages in owners:
                for p in pages:
                    counts[p] += 1
            for p, (want, got) in enumerate(zip(counts, self._refs, strict=True)):
                assert want == got, f"page {p}: refcount {got} but {want} holders"
