"""LoraSlots, the device residency of adapters, as pure bookkeeping: references, least-recently-used
eviction of idle slots only, refusal when every slot is held, forgetting."""

import pytest

from worker.engine.lora.slots import LoraSlots


def test_idle_slots_are_reused_least_recently_used_first() -> None:
    loads: list[tuple[int, int]] = []
    slots = LoraSlots(2, lambda slot, adapter: loads.append((slot, adapter)))
    a = slots.acquire(10)
    b = slots.acquire(20)
    assert (a, b) == (0, 1) and loads == [(0, 10), (1, 20)]
    assert slots.acquire(10) == a and len(loads) == 2  # resident: no swap
    assert not slots.available(30)  # both held
    with pytest.raises(RuntimeError, match="every LoRA slot is held"):
        slots.acquire(30)
    slots.release(b)  # 20 idle
    slots.release(a)
    slots.release(a)  # 10 idle, used more recently than 20
    assert slots.available(30)
    assert slots.acquire(30) == b and loads[-1] == (b, 30)  # 20's slot: used least recently
    assert 20 not in slots.slot_of and slots.slot_of[10] == a  # 10 still resident, idle
    assert slots.acquire(10) == a and slots.swaps == 3
    slots.check_invariants()


def test_forget_frees_an_idle_slot_and_refuses_a_held_one() -> None:
    slots = LoraSlots(2, lambda slot, adapter: None)
    s = slots.acquire(1)
    with pytest.raises(RuntimeError, match="in use"):
        slots.forget(1)
    slots.release(s)
    slots.forget(1)
    assert 1 not in slots.slot_of and s in slots.free
    with pytest.raises(RuntimeError, match="released more often"):
        slots.release(s)
    slots.refs[s] = 0
    slots.check_invariants()
