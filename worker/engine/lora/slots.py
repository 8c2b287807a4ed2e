"""LoraSlots: which adapters are resident on the device (at most max_loras), swapped in from host
memory least-recently-used first.

A running sequence with an adapter holds its slot (a reference count) from the moment it takes a
batch row until it leaves it (finish, preemption, abort). An adapter whose count falls to 0 stays
resident, idle, until its slot is needed for another: the idle slot used longest ago is rewritten.
A sequence whose adapter is not resident and finds every slot held waits in the queue
(`available`), like one that finds no free KV block. Pure Python over ints.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable


class LoraSlots:
    def __init__(self, num_slots: int, load: Callable[[int, int], None]) -> None:
        """load(slot, adapter_id): write the adapter's factors into the slot (LoraStacks.write)."""
        self.num_slots = num_slots
        self._load = load
        self.slot_of: dict[int, int] = {}  # resident adapter id -> slot
        self.adapter_in: list[int | None] = [None] * num_slots
        self.refs = [0] * num_slots
        self.idle: OrderedDict[int, None] = OrderedDict()  # resident slots with no reference, oldest first
        self.free = list(range(num_slots - 1, -1, -1))  # never written (pop takes slot 0 first)
        self.swaps = 0  # adapters written into a slot (cumulative)

    def available(self, adapter: int) -> bool:
        """Whether `acquire(adapter)` would succeed now."""
        return adapter in self.slot_of or bool(self.free) or bool(self.idle)

    def acquire(self, adapter: int) -> int:
        """The adapter's slot, swapped in if needed; one more reference. RuntimeError if every slot is
        held (the scheduler asks `available` first)."""
        slot = self.slot_of.get(adapter)
        if slot is None:
            if self.free:
                slot = self.free.pop()
            elif self.idle:
                slot, _ = self.idle.popitem(last=False)
                del self.slot_of[self.adapter_in[slot]]  # type: ignore[index]
            else:
                raise RuntimeError("every LoRA slot is held by running sequences; check available() first")
            self._load(slot, adapter)
            self.swaps += 1
            self.slot_of[adapter] = slot
            self.adapter_in[slot] = adapter
        elif self.refs[slot] == 0:
            del self.idle[slot]
        self.refs[slot] += 1
        return slot

    def release(self, slot: int) -> None:
        self.refs[slot] -= 1
        if self.refs[slot] < 0:
            raise RuntimeError(f"LoRA slot {slot} released more often than acquired")
        if self.refs[slot] == 0:
            self.idle[slot] = None  # most recently used: evicted last

    def forget(self, adapter: int) -> None:
        """Drop an adapter that is no longer registered (it must hold no reference)."""
        slot = self.slot_of.get(adapter)
        if slot is None:
            return
        if self.refs[slot]:
            raise RuntimeError(f"adapter {adapter} is in use by running sequences")
        del self.slot_of[adapter]
        del self.idle[slot]
        self.adapter_in[slot] = None
        self.free.append(slot)

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping disagrees with itself (tests)."""
        assert all(r >= 0 for r in self.refs)
        assert set(self.idle) == {s for s, a in enumerate(self.adapter_in) if a is not None and self.refs[s] == 0}
        assert {s: a for a, s in self.slot_of.items()} == {s: a for s, a in enumerate(self.adapter_in) if a is not None}
        assert set(self.free) == {s for s, a in enumerate(self.adapter_in) if a is None}
