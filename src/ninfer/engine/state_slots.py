"""StateImage slot pool: which device state slot each resident sequence owns.

Capacity is max_concurrency + device_state_slots; the extra slots will hold prefix checkpoints and
paused sequences. Slot ids index `ModelCache`'s conv and recurrent state tensors.
"""

from __future__ import annotations


class SlotPool:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError("need at least one state slot")
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int | None:
        if not self._free:
            return None
        slot = self._free.pop()
        self._used.add(slot)
        return slot

    def release(self, slot: int) -> None:
        assert slot in self._used, f"release of free slot {slot}"
        self._used.remove(slot)
        self._free.append(slot)

    def check_integrity(self) -> None:
        assert len(self._free) + len(self._used) == self.num_slots
        assert not (set(self._free) & self._used)
