"""The adapter slots of the device: which adapter each holds, who uses it, which one to evict.

`--max-loras` slots hold one adapter's weights each (weights.py). Every slot is in one state:

    state      adapter    refs (running sequences)   kept in                 leaves it by
    free       none       0                          _free                   acquire() of a new adapter
    pinned     resident   >= 1                       (nowhere: refs > 0)     release() down to 0
    idle       resident   0                          _idle (LRU: least       acquire() of it (a hit) or
                                                     recently released       eviction by a new adapter;
                                                     first)                  forget() frees it

A sequence holds one slot from admission until it stops running (finished, preempted, ending); a
waiting sequence whose adapter is not resident waits while every slot is pinned (the batch can mix
at most --max-loras adapters). A forgotten adapter (unloaded) goes free as soon as its last sequence
releases it instead of idling; only sequences admitted before the unload still ask for it (one
preempted meanwhile gets a slot again to finish).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Acquired:
    slot: int
    needs_write: bool  # the slot did not hold this adapter: its weights must be copied in


class LoraSlots:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"--max-loras must be >= 1, got {num_slots}")
        self.num_slots = num_slots
        self._free: list[int] = list(range(num_slots - 1, -1, -1))  # popped from the end: slot 0 first
        self._idle: OrderedDict[int, None] = OrderedDict()
        self._uid_of: dict[int, int] = {}  # slot -> uid of the adapter it holds
        self._slot_of: dict[int, int] = {}  # uid -> slot
        self._refs: dict[int, int] = {}  # slot -> sequences holding it
        self._held: dict[str, int] = {}  # seq_id -> slot
        self._forgotten: set[int] = set()
        self.num_evicted = 0

    def slot_of(self, seq_id: str) -> int | None:
        return self._held.get(seq_id)

    def resident(self, uid: int) -> bool:
        return uid in self._slot_of

    def acquire(self, seq_id: str, uid: int) -> Acquired | None:
        """A slot holding adapter `uid` for the sequence: its own, a resident one, a free one, or the
        least recently released idle one evicted. None when every slot is pinned by other adapters."""
        if seq_id in self._held:
            raise ValueError(f"sequence {seq_id!r} already holds LoRA slot {self._held[seq_id]}")
        slot = self._slot_of.get(uid)
        needs_write = slot is None
        if slot is None:
            if self._free:
                slot = self._free.pop()
            elif self._idle:
                slot, _ = self._idle.popitem(last=False)
                del self._slot_of[self._uid_of.pop(slot)]
                self.num_evicted += 1
            else:
                return None
            self._uid_of[slot], self._slot_of[uid] = uid, slot
        self._idle.pop(slot, None)
        self._refs[slot] = self._refs.get(slot, 0) + 1
        self._held[seq_id] = slot
        return Acquired(slot, needs_write)

    def release(self, seq_id: str) -> None:
        """The sequence stops running; a no-op for one holding no slot."""
        slot = self._held.pop(seq_id, None)
        if slot is None:
            return
        self._refs[slot] -= 1
        if self._refs[slot] == 0:
            del self._refs[slot]
            if self._uid_of[slot] in self._forgotten:
                self._drop(slot)
            else:
                self._idle[slot] = None

    def forget(self, uid: int) -> int | None:
        """Adapter `uid` was unloaded: its slot goes free now if idle, else at its last release (uids are
        never reused, so the mark stays). Returns the slot freed now (its weights may be cleared), if any."""
        self._forgotten.add(uid)
        slot = self._slot_of.get(uid)
        if slot is not None and slot not in self._refs:
            self._idle.pop(slot)
            self._drop(slot)
            return slot
        return None

    def _drop(self, slot: int) -> None:
        uid = self._uid_of.pop(slot)
        del self._slot_of[uid]
        self._free.append(slot)

    def check_integrity(self) -> None:
        """Raise AssertionError naming the first broken invariant of the table at the top of this file."""
        free, idle, pinned = set(self._free), set(self._idle), set(self._refs)
        if len(free) + len(idle) + len(pinned) != self.num_slots or free | idle | pinned != set(range(self.num_slots)):
            raise AssertionError(f"slots not partitioned: free {free}, idle {idle}, pinned {pinned}")
        if set(self._uid_of) != idle | pinned or {self._slot_of[u]: u for u in self._slot_of} != self._uid_of:
            raise AssertionError(f"resident map broken: {self._uid_of} vs {self._slot_of}")
        counts: dict[int, int] = {}
        for slot in self._held.values():
            counts[slot] = counts.get(slot, 0) + 1
        if counts != self._refs:
            raise AssertionError(f"refs {self._refs} but sequences hold {counts}")
