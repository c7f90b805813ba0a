"""StateImages: one sequence's recurrent and conv state at a token frontier, kept for later.

No tensors (the runner performs the `CopyOp`s this module writes). An image lives in a device
image slot (the `device_state_slots` slots beyond the lanes of `ModelCache`) or in a block of the
shared pinned host pool (`HostPool`, `--host-context-mib`, also holding host KV and pause
snapshots). Images are refcounted by their owners and stamped for LRU; every copy is
stream-ordered behind the step that produced its source, so nothing here waits for the device.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from ninfer.engine.plan import PAGES, STATE, CopyOp
from ninfer.engine.recovery import transfer_bytes


class HostPool:
    """A byte budget of pinned host memory, handed out as numbered blocks."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError("the host context budget must be >= 0 bytes")
        self.budget = budget_bytes
        self.used = 0
        self._blocks: dict[int, int] = {}  # block id -> bytes
        self._ids = itertools.count()

    @property
    def num_free_bytes(self) -> int:
        return self.budget - self.used

    def allocate(self, num_bytes: int) -> int | None:
        """A new block of `num_bytes`, or None (and no change) when the budget cannot hold it."""
        if num_bytes > self.budget - self.used:
            return None
        block = next(self._ids)
        self._blocks[block] = num_bytes
        self.used += num_bytes
        return block

    def free(self, block: int) -> None:
        self.used -= self._blocks.pop(block)

    def blocks(self) -> dict[int, int]:
        return dict(self._blocks)

    def check_integrity(self, owned: Iterable[int] | None = None) -> None:
        """Used bytes add up; with `owned`, every block has exactly one owner."""
        assert 0 <= self.used <= self.budget, (self.used, self.budget)
        assert sum(self._blocks.values()) == self.used, "host bytes leaked"
        if owned is not None:
            owned = list(owned)
            assert len(owned) == len(set(owned)), "a host block has two owners"
            assert set(owned) == set(self._blocks), (
                f"host blocks {sorted(self._blocks)} != owned {sorted(owned)}"
            )


@dataclass(eq=False)
class StateImage:
    """Where one image is: a device image slot or a host block (exactly one of them)."""

    slot: int | None
    block: int | None = None
    refs: int = 1
    last_used: int = 0

    @property
    def on_device(self) -> bool:
        return self.slot is not None


class StateImages:
    """The device image slots and the host images spilled from them.

    `capture(lane_slot, copies)` takes a free device slot and appends the copy that fills it;
    `spill` moves an image to the host pool; `restore` appends the copy back into a lane slot.
    The caller (the prefix cache) chooses what to evict; this pool only accounts.
    """

    def __init__(
        self, slots: Iterable[int], host: HostPool, image_bytes: int, page_bytes: int = 0
    ) -> None:
        self.slots = tuple(slots)
        self.host = host
        self.image_bytes = image_bytes
        self.page_bytes = page_bytes  # one KV page of every full-attention layer
        self._free = list(reversed(self.slots))
        self._live: set[StateImage] = set()
        self._tick = itertools.count(1)
        # counters (plain ints: the observability layer publishes them)
        self.num_captures = 0
        self.num_restores = 0
        self.num_spills = 0
        # bytes of every device <-> host copy written, by resource ("state", "main_kv") and
        # direction ("to_host", "to_device"): ninfer_context_transfer_bytes_total
        self.transferred = transfer_bytes()
        self.peak_host_bytes = 0

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def live(self) -> frozenset[StateImage]:
        return frozenset(self._live)

    def touch(self, image: StateImage) -> None:
        image.last_used = next(self._tick)

    def capture(
        self, lane_slot: int, copies: list[CopyOp], *, device: bool = True
    ) -> StateImage | None:
        """A new image of `lane_slot`'s state as of the copy's place in the stream: in a free
        device slot (when `device`), else in the host pool; None when neither has room."""
        if device and self._free:
            image = StateImage(self._free.pop())
            copies.append(CopyOp(STATE, (lane_slot,), (image.slot,)))  # type: ignore[arg-type]
        else:
            block = self.host.allocate(self.image_bytes)
            if block is None:
                return None
            image = StateImage(None, block)
            copies.append(CopyOp(STATE, (lane_slot,), (block,), dst_host=True))
            self._moved("state", "to_host", self.image_bytes)
        self._live.add(image)
        self.touch(image)
        self.num_captures += 1
        return image

    def spill(self, image: StateImage, copies: list[CopyOp]) -> bool:
        """Move a device image to the host pool, freeing its slot; False without host room."""
        assert image in self._live and image.on_device
        block = self.host.allocate(self.image_bytes)
        if block is None:
            return False
        assert image.slot is not None
        copies.append(CopyOp(STATE, (image.slot,), (block,), dst_host=True))
        self._moved("state", "to_host", self.image_bytes)
        self._free.append(image.slot)
        image.slot, image.block = None, block
        self.num_spills += 1
        return True

    def restore(self, image: StateImage, lane_slot: int, copies: list[CopyOp]) -> None:
        """Fill `lane_slot` with the image (device-to-device, or host-to-device)."""
        assert image in self._live
        self.touch(image)
        if image.on_device:
            copies.append(CopyOp(STATE, (image.slot,), (lane_slot,)))  # type: ignore[arg-type]
        else:
            copies.append(CopyOp(STATE, (image.block,), (lane_slot,), src_host=True))  # type: ignore[arg-type]
            self._moved("state", "to_device", self.image_bytes)
        self.num_restores += 1

    def _moved(self, resource: str, direction: str, num_bytes: int) -> None:
        self.transferred[resource][direction] += num_bytes
        self.peak_host_bytes = max(self.peak_host_bytes, self.host.used)

    # -- host KV (pause snapshots) ------------------------------------------------------------
    def pages_to_host(self, pages: list[int], copies: list[CopyOp]) -> int | None:
        """One host block holding `pages` in order, or None without host room."""
        block = self.host.allocate(len(pages) * self.page_bytes)
        if block is None:
            return None
        copies.append(CopyOp(PAGES, tuple(pages), (block,), dst_host=True))
        self._moved("main_kv", "to_host", len(pages) * self.page_bytes)
        return block

    def pages_from_host(self, block: int, pages: list[int], copies: list[CopyOp]) -> None:
        copies.append(CopyOp(PAGES, (block,), tuple(pages), src_host=True))
        self._moved("main_kv", "to_device", len(pages) * self.page_bytes)

    def free_block(self, block: int, free_host: list[int]) -> None:
        self.host.free(block)
        free_host.append(block)

    def retain(self, image: StateImage) -> None:
        assert image in self._live and image.refs > 0
        image.refs += 1

    def release(self, image: StateImage, free_host: list[int]) -> None:
        """Drop one reference; the last one frees the slot (or the host block, listed in
        `free_host` so the runner drops its memory after the plan's copies)."""
        assert image in self._live and image.refs > 0, "release of a dead image"
        image.refs -= 1
        if image.refs:
            return
        self._live.remove(image)
        if image.on_device:
            assert image.slot is not None
            self._free.append(image.slot)
        else:
            assert image.block is not None
            self.host.free(image.block)
            free_host.append(image.block)

    def check_integrity(self, owners: Iterable[StateImage] | None = None) -> None:
        """Slots are free or held by exactly one live image; with `owners` (one entry per
        reference), every live image's refcount equals its owner count."""
        held = [i.slot for i in self._live if i.on_device]
        assert len(held) == len(set(held)), "two images share a device slot"
        assert not set(held) & set(self._free), "a device image slot is both held and free"
        assert len(held) + len(self._free) == len(self.slots), "device image slots leaked"
        assert set(held) | set(self._free) == set(self.slots)
        for image in self._live:
            assert (image.slot is None) != (image.block is None), "an image is in two places"
            assert image.refs > 0
        if owners is not None:
            counts: dict[StateImage, int] = {}
            for image in owners:
                counts[image] = counts.get(image, 0) + 1
            assert set(counts) == self._live, "an image without owner, or an owner of a dead one"
            for image, n in counts.items():
                assert image.refs == n, f"image refcount {image.refs} != {n} owners"
