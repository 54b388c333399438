"""Continuous batching on a per-step token budget.

Each step: running sequences first (one token each when decoding, the next
chunk when still prefilling), then waiting sequences are admitted while the
budget, the running cap and the KV cache allow. A waiting sequence starts
from its longest prefix-cache hit. A waiting sequence whose first uncached
block is one this step already computes for another sequence (requests
arriving together with a shared prompt prefix) waits for the next step and
then hits the cache, instead of computing the same K/V again; later waiting
sequences may be admitted past it meanwhile. When a running sequence cannot get the
blocks it needs, the most recently admitted sequence (or, with priority
scheduling, the least important one) is preempted: its blocks are freed and
it waits to be recomputed (prefix caching usually makes that cheap).

A sequence known to end at the engine's next postprocess (Sequence.is_ending:
aborted, or holding its last allowed token, maybe still on the device) needs
no more K/V: it leaves the running queue and gives its blocks back before the
step is planned, as if it had finished already, and a waiting one is not
admitted. The engine finishes it (remove()).

A sequence of a LoRA adapter also needs one of the --max-loras adapter slots to be admitted
(lora/slots.py): when every slot is pinned by running sequences of other adapters it waits, and
later waiting sequences may be admitted past it meanwhile.

The scheduler knows nothing about gRPC or the model: it moves Sequences
between queues and asks the BlockManager for blocks.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from services.engine.block_manager import BlockManager
from services.engine.block_pool import BlockKey
from services.engine.sequence import Sequence, Status

if TYPE_CHECKING:
    from services.engine.lora.manager import LoraManager

Policy = Literal["fcfs", "priority"]


@dataclass(frozen=True)
class ScheduledSequence:
    seq: Sequence
    # Tokens computed this step: token_ids[num_computed_tokens : num_computed_tokens + num_new_tokens].
    num_new_tokens: int


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_batched_tokens: int,
        max_running_requests: int,
        policy: Policy = "fcfs",
        lora: LoraManager | None = None,
    ) -> None:
        self.block_manager = block_manager
        # Adapter slots: a sequence of an adapter holds one while running (lora/slots.py); one whose
        # adapter gets no slot (all in use by other adapters) waits, and later ones may pass it.
        self.lora = lora
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_running_requests = max_running_requests
        self.policy = policy
        # Waiting: sorted by _order (FCFS: arrival; priority: (priority, arrival)), so a
        # preempted sequence goes back ahead of everything that arrived after it.
        self.waiting: list[Sequence] = []
        # Running: in admission order; the last one is the first preemption victim under FCFS.
        self.running: list[Sequence] = []
        # Sequences preempted since start (metrics; written by the step loop only).
        self.num_preemptions = 0

    def _order(self, seq: Sequence) -> tuple[int, int]:
        return (seq.priority, seq.arrival) if self.policy == "priority" else (0, seq.arrival)

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        bisect.insort(self.waiting, seq, key=self._order)

    def add_fork(
        self,
        parent: Sequence,
        child: Sequence,
        num_tokens: int | None = None,
        copy_block: Callable[[int, int], None] | None = None,
    ) -> None:
        """Run a new sample of the parent's request at once, on the parent's computed full blocks covering
        its first `num_tokens` tokens (default: its prompt).

        The child holds its next token (maybe still a placeholder); it computes the partial last block of
        those tokens and that token itself (less than a block plus one), then decodes like any other
        running sequence. With `copy_block(src, dst)` (which copies one block's K/V) the partial block is
        copied into a block of the child's own instead, when one is free (beam_search.py).
        """
        upto = parent.num_prompt_tokens if num_tokens is None else num_tokens
        shared = self.block_manager.fork(parent.seq_id, child.seq_id, upto)
        if copy_block is not None and shared < upto:
            copied = self.block_manager.copy_tail(parent.seq_id, child.seq_id)
            if copied is not None:
                copy_block(*copied)
                shared = upto
        if child.lora is not None:
            # The parent runs and pins the same adapter's slot, so this never waits.
            acquired = self._acquire_lora(child)
            assert acquired, "a fork's adapter is its running parent's"
        child.num_computed_tokens = shared
        child.status = Status.RUNNING
        self.running.append(child)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence) -> None:
        """Take a sequence out (finished or aborted) and release its blocks."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self._free(seq)
        seq.status = Status.FINISHED

    def schedule(self) -> SchedulerOutput:
        self._release_ending()
        budget = self.max_num_batched_tokens
        scheduled: list[ScheduledSequence] = []
        preempted: list[Sequence] = []
        # Keys of the full prompt blocks this step computes: a waiting sequence about to compute one of
        # them too waits a step and reads it from the cache instead.
        computing: set[BlockKey] = set()

        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not Status.RUNNING:  # preempted earlier in this loop
                continue
            if seq.num_tokens_to_compute == 0:  # a beam waiting for its siblings (beam_search.py)
                continue
            num_new = min(seq.num_tokens_to_compute, budget)
            while not self.block_manager.allocate(seq.seq_id, seq.num_computed_tokens + num_new):
                victim = self._preemption_victim()
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.status is Status.RUNNING:
                scheduled.append(ScheduledSequence(seq, num_new))
                budget -= num_new
                self._note_computed_prompt_blocks(seq, num_new, computing)

        # Admitting while preempting would only thrash the cache.
        for seq in [] if preempted else list(self.waiting):
            if budget == 0 or len(self.running) >= self.max_running_requests:
                break
            if seq.is_ending:
                continue
            # Prompt log-probabilities and mean/first pooling need every prompt position computed, so no
            # prefix hit then.
            use_cache = not seq.needs_every_prompt_position
            salt = seq.cache_salt
            cached = self.block_manager.match_prefix(seq.seq_id, seq.token_ids, salt) if use_cache else 0
            if use_cache and computing and self._next_block_is_computing(seq, cached, computing):
                self.block_manager.free(seq.seq_id)
                continue
            if seq.lora is not None and not self._acquire_lora(seq):
                self.block_manager.free(seq.seq_id)
                continue
            num_new = min(seq.num_tokens - cached, budget)
            if not self.block_manager.allocate(seq.seq_id, cached + num_new):
                self._free(seq)
                break
            self.waiting.remove(seq)
            seq.num_computed_tokens = cached
            if seq.num_preemptions == 0:
                seq.num_cached_tokens = cached
            seq.status = Status.RUNNING
            self.running.append(seq)
            scheduled.append(ScheduledSequence(seq, num_new))
            budget -= num_new
            if use_cache:
                self._note_computed_prompt_blocks(seq, num_new, computing)

        return SchedulerOutput(scheduled, preempted)

    def _note_computed_prompt_blocks(self, seq: Sequence, num_new: int, computing: set[BlockKey]) -> None:
        """Add the keys of the full prompt blocks that seq's num_new tokens of this step complete."""
        if seq.num_computed_tokens >= seq.num_prompt_tokens:
            return  # decoding: its blocks hold generated tokens, which no waiting prompt shares yet
        end = min(seq.num_computed_tokens + num_new, seq.num_prompt_tokens)
        computing.update(self.block_manager.keys_of_new_blocks(seq.seq_id, seq.token_ids, end, seq.cache_salt))

    def _next_block_is_computing(self, seq: Sequence, cached: int, computing: set[BlockKey]) -> bool:
        """Whether the first block of seq past its `cached` tokens is among `computing` and one that
        match_prefix could hit next step (never the block holding its last token)."""
        bs = self.block_manager.block_size
        if cached + bs > (seq.num_tokens - 1) // bs * bs:
            return False
        first = self.block_manager.keys_of_new_blocks(seq.seq_id, seq.token_ids, cached + bs, seq.cache_salt)
        return bool(first) and first[0] in computing

    def commit(self, output: SchedulerOutput) -> None:
        """The step's tokens now have K/V in the cache: advance the counts, publish full blocks. A sequence
        finished since it was scheduled (the engine postprocessed its previous token meanwhile) has no
        blocks left and is skipped."""
        for item in output.scheduled:
            seq = item.seq
            if seq.is_finished:
                continue
            seq.num_computed_tokens += item.num_new_tokens
            self.block_manager.cache_full_blocks(seq.seq_id, seq.token_ids, seq.num_computed_tokens, seq.cache_salt)

    def _release_ending(self) -> None:
        for seq in [seq for seq in self.running if seq.is_ending]:
            self.running.remove(seq)
            self._free(seq)

    def _preemption_victim(self) -> Sequence:
        if self.policy == "priority":
            return max(self.running, key=self._order)
        return self.running[-1]

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.add(seq)

    def _acquire_lora(self, seq: Sequence) -> bool:
        assert self.lora is not None and seq.lora is not None, "the engine refuses adapters without LoRA on"
        return self.lora.acquire(seq.seq_id, seq.lora)

    def _free(self, seq: Sequence) -> None:
        """Give back everything a sequence holds: its blocks and its adapter slot."""
        self.block_manager.free(seq.seq_id)
        if self.lora is not None:
            self.lora.release(seq.seq_id)
