"""The runner's copy engine: performs a plan's `CopyOp`s on `ModelCache` and the host pool.

Imports torch and model/ only. The host side holds one entry per host block (pinned memory on
CUDA; torch's caching host allocator recycles freed blocks). Every copy is enqueued on the
current stream, behind the step that wrote its source and ahead of the step that reads its
destination, so the host never waits here.
NOTE: stream-ordered, not on a side stream: overlapping the copies with compute needs events
between two streams, which nothing in this tree can test without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ninfer.engine.plan import FOLD, PAGES, STATE, CopyOp
from ninfer.model.cache import ModelCache
from ninfer.model.layers.gated_deltanet import fold_verify_layers


class CopyEngine:
    def __init__(self, cache: ModelCache, device: torch.device) -> None:
        self.cache = cache
        self.device = device
        self._pin = device.type == "cuda"
        self.host: dict[int, list[torch.Tensor]] = {}

    def run(self, copies: Iterable[CopyOp], free_host: Iterable[int] = ()) -> None:
        for op in copies:
            if op.kind == STATE:
                self._state(op)
            elif op.kind == FOLD:
                self._fold(op)
            else:
                assert op.kind == PAGES
                self._pages(op)
        for block in free_host:
            self.host.pop(block, None)

    # -- StateImages ---------------------------------------------------------------------------
    def _state_tensors(self) -> list[torch.Tensor]:
        return [*self.cache.conv_state, *self.cache.ssm_state]

    def _state(self, op: CopyOp) -> None:
        (src,), (dst,) = op.src, op.dst
        if not op.src_host and not op.dst_host:
            self.cache.copy_slot(src, dst)
        elif op.dst_host:
            self.host[dst] = [self._to_host(t[src]) for t in self._state_tensors()]
        else:
            for t, h in zip(self._state_tensors(), self.host[src], strict=True):
                t[dst].copy_(h, non_blocking=True)

    # -- speculative rounds --------------------------------------------------------------------
    def _fold(self, op: CopyOp) -> None:
        """Advance slots over their kept verify columns."""
        fold_latest(self.cache, op.dst, op.src, self.device)

    # -- KV pages ------------------------------------------------------------------------------
    def _kv_tensors(self) -> list[torch.Tensor]:
        # values and, for a quantized KV dtype, their scales: a page moves with its scales
        return self.cache.page_tensors()

    def _index(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(ids), dtype=torch.int64).to(self.device, non_blocking=True)

    def _pages(self, op: CopyOp) -> None:
        if not op.src_host and not op.dst_host:
            src, dst = self._index(op.src), self._index(op.dst)
            for t in self._kv_tensors():
                t.index_copy_(0, dst, t.index_select(0, src))
        elif op.dst_host:
            src = self._index(op.src)
            self.host[op.dst[0]] = [
                self._to_host(t.index_select(0, src)) for t in self._kv_tensors()
            ]
        else:
            dst = self._index(op.dst)
            for t, h in zip(self._kv_tensors(), self.host[op.src[0]], strict=True):
                assert h.shape[0] == len(op.dst), "a host KV block restores to as many pages"
                t.index_copy_(0, dst, h.to(self.device, non_blocking=True))

    def _to_host(self, t: torch.Tensor) -> torch.Tensor:
        out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self._pin)
        out.copy_(t, non_blocking=True)
        return out

    def host_bytes(self) -> int:
        """Bytes the host blocks hold now (tests compare it with the pool's accounting)."""
        return sum(t.numel() * t.element_size() for ts in self.host.values() for t in ts)


def fold_latest(
    cache: ModelCache,
    slots: Sequence[int],
    columns: Sequence[int] | torch.Tensor,
    device: torch.device,
    most: int | None = None,
) -> None:
    """Advance each slot over the first `columns` columns of its latest verify row
    (`ModelCache.verify_records`), one fold per verify step that recorded them.

    `columns`: one count per slot from the host (a FOLD copy), or a device tensor indexed by
    slot (a chained round's: what the round before it kept, never seen by the host), then with
    `most` its host bound."""
    on_device = isinstance(columns, torch.Tensor)
    groups: dict[int, tuple[list[Any], list[tuple[int, int, int]]]] = {}
    for i, slot in enumerate(slots):
        row, records = cache.verify_records[slot]
        num = 0 if on_device else columns[i]
        groups.setdefault(id(records), (records, []))[1].append((slot, row, num))
    for records, members in groups.values():
        flat = [v for column in zip(*members, strict=True) for v in column]
        index = torch.tensor(flat, dtype=torch.int64).to(device, non_blocking=True)
        slot_ids, rows, nums = index.view(3, len(members))  # one transfer
        if on_device:
            assert most is not None, "a device column count needs its host bound"
            nums, bound = columns.index_select(0, slot_ids), most
        else:
            bound = max(m[2] for m in members)
        fold_verify_layers(records, cache.conv_state, cache.ssm_state, slot_ids, rows, nums, bound)
