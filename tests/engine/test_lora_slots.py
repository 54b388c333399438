"""The adapter slots (lora/slots.py): exact slots handed out, LRU eviction order, pinning, forget."""

from __future__ import annotations

import pytest

from services.engine.lora.batch import LoraBatch
from services.engine.lora.slots import Acquired, LoraSlots


def test_slots_fill_then_evict_the_least_recently_released() -> None:
    slots = LoraSlots(2)
    assert slots.acquire("s1", uid=10) == Acquired(0, needs_write=True)
    assert slots.acquire("s2", uid=10) == Acquired(0, needs_write=False)  # resident: no copy
    assert slots.acquire("s3", uid=20) == Acquired(1, needs_write=True)
    assert slots.acquire("s4", uid=30) is None  # both pinned
    slots.release("s3")  # slot 1 idle (uid 20)
    slots.release("s1")
    slots.release("s2")  # slot 0 idle (uid 10), released after slot 1
    slots.check_integrity()
    assert slots.acquire("s4", uid=30) == Acquired(1, needs_write=True)  # evicts 20, the older release
    assert not slots.resident(20) and slots.resident(10) and slots.num_evicted == 1
    assert slots.acquire("s5", uid=10) == Acquired(0, needs_write=False)  # a hit on the idle one
    slots.check_integrity()
    assert (slots.slot_of("s5"), slots.slot_of("s1")) == (0, None)
    with pytest.raises(ValueError, match="already holds"):
        slots.acquire("s5", uid=10)


def test_forget_frees_an_idle_slot_now_and_a_pinned_one_at_its_last_release() -> None:
    slots = LoraSlots(2)
    slots.acquire("a", uid=1)
    slots.acquire("b", uid=2)
    slots.release("b")
    assert slots.forget(2) == 1  # idle: free at once
    assert slots.forget(1) is None  # pinned by "a"
    assert slots.resident(1)
    # A preempted request of the unloaded adapter gets a slot again to finish.
    assert slots.acquire("a2", uid=1) == Acquired(0, needs_write=False)
    slots.release("a")
    slots.release("a2")
    assert not slots.resident(1)
    slots.check_integrity()
    assert slots.acquire("c", uid=3) == Acquired(0, needs_write=True)  # free slots go lowest first


def test_batch_groups_adapter_tokens_by_slot() -> None:
    import torch

    assert LoraBatch.of([-1, -1], torch.device("cpu")) is None
    batch = LoraBatch.of([1, -1, 0, 1, 0, -1, 1], torch.device("cpu"))
    assert batch is not None
    assert batch.order.tolist() == [2, 4, 0, 3, 6]
    assert batch.segments == ((0, 0, 2), (1, 2, 5))
    assert batch.seg_starts.tolist() == [0, 2, 5] and batch.seg_slots.tolist() == [0, 1]
    assert batch.max_segment == 3 and batch.num_tokens == 5
