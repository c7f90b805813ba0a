"""Pause snapshots: a paused sequence's recurrent state and KV pages, kept in the host pool.

No tensors (the copies are `CopyOp`s). A snapshot is taken when the host budget holds the
sequence's StateImage and its KV pages; it is restored into a fresh lane slot and fresh pages,
bit for bit, and its host blocks are freed once the restoring copies ran. Without host room the
scheduler pauses by dropping the state instead and rebuilds it later by replay.
"""

from __future__ import annotations

from dataclasses import dataclass

from ninfer.engine.plan import CopyOp
from ninfer.engine.state_images import StateImage, StateImages


@dataclass(eq=False)
class Snapshot:
    """State after the first `frontier` tokens: an image and (when any) a block of KV pages."""

    frontier: int
    image: StateImage
    kv_block: int | None
    num_pages: int

    def host_blocks(self) -> list[int]:
        assert self.image.block is not None
        return [self.image.block] + ([self.kv_block] if self.kv_block is not None else [])


def take(
    images: StateImages, slot: int, pages: list[int], frontier: int, copies: list[CopyOp]
) -> Snapshot | None:
    """Copy `slot`'s state and the pages covering `frontier` tokens to the host, or None (and
    no change) when the host budget cannot hold both."""
    need = images.image_bytes + len(pages) * images.page_bytes
    if images.host.num_free_bytes < need:
        return None
    image = images.capture(slot, copies, device=False)
    assert image is not None
    block = images.pages_to_host(pages, copies) if pages else None
    assert block is not None or not pages
    return Snapshot(frontier, image, block, len(pages))


def restore(
    images: StateImages,
    snapshot: Snapshot,
    slot: int,
    pages: list[int],
    copies: list[CopyOp],
    free_host: list[int],
) -> None:
    """Fill `slot` and the first `snapshot.num_pages` of `pages`; the host blocks go."""
    if snapshot.kv_block is not None:
        images.pages_from_host(snapshot.kv_block, pages[: snapshot.num_pages], copies)
        images.free_block(snapshot.kv_block, free_host)
    images.restore(snapshot.image, slot, copies)
    images.release(snapshot.image, free_host)


def drop(images: StateImages, snapshot: Snapshot, free_host: list[int]) -> None:
    """A paused request ended (stop, cancel, failure): its snapshot is no longer needed."""
    if snapshot.kv_block is not None:
        images.free_block(snapshot.kv_block, free_host)
    images.release(snapshot.image, free_host)
