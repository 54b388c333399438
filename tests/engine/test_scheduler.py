"""Scheduler with tiny configs, driven by hand: no model, no gRPC."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.engine.block_manager import BlockManager
from services.engine.request import EngineRequest
from services.engine.sampling_params import SamplingSettings
from services.engine.scheduler import Policy, Scheduler, SchedulerOutput
from services.engine.sequence import Sequence, Status, placeholder

BLOCK = 4


def make_seq(rid: str, prompt: list[int], max_new: int = 8, priority: int = 0) -> Sequence:
    settings = SamplingSettings(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)
    return Sequence(EngineRequest(rid, tuple(prompt), settings), priority=priority)


class Harness:
    def __init__(self, blocks: int, budget: int, max_running: int = 8, policy: Policy = "fcfs") -> None:
        self.blocks = BlockManager(blocks, BLOCK)
        self.scheduler = Scheduler(
            self.blocks, max_num_batched_tokens=budget, max_running_requests=max_running, policy=policy
        )

    def step(self) -> SchedulerOutput:
        """One engine step without a model: schedule, commit, append a fake token where sampled."""
        out = self.scheduler.schedule()
        self.scheduler.commit(out)
        for item in out.scheduled:
            seq = item.seq
            if seq.num_computed_tokens == seq.num_tokens:
                seq.token_ids.append(1000 + seq.num_output_tokens)
        return out


@pytest.fixture
def harness_factory() -> Iterator[type[Harness]]:
    made: list[Harness] = []

    class Checked(Harness):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            made.append(self)

    yield Checked
    for harness in made:
        harness.blocks.check_integrity()


def plan(out: SchedulerOutput) -> list[tuple[str, int]]:
    return [(item.seq.request.request_id, item.num_new_tokens) for item in out.scheduled]


def test_running_decodes_come_first_then_admission_within_budget(harness_factory: type[Harness]) -> None:
    h = harness_factory(blocks=32, budget=8)
    a, b, c = make_seq("a", list(range(3))), make_seq("b", list(range(10, 13))), make_seq("c", list(range(20, 30)))
    for seq in (a, b):
        h.scheduler.add(seq)
    assert plan(h.step()) == [("a", 3), ("b", 3)]
    h.scheduler.add(c)
    # a and b decode one token each; c gets the 6 tokens left in the budget (chunked).
    assert plan(h.step()) == [("a", 1), ("b", 1), ("c", 6)]
    assert plan(h.step()) == [("a", 1), ("b", 1), ("c", 4)]
    assert c.num_output_tokens == 1 and a.num_output_tokens == 3


def test_long_prompt_is_prefilled_in_chunks_and_sampled_once(harness_factory: type[Harness]) -> None:
    h = harness_factory(blocks=32, budget=4)
    seq = make_seq("long", list(range(10)))
    h.scheduler.add(seq)
    assert [plan(h.step()) for _ in range(4)] == [[("long", 4)], [("long", 4)], [("long", 2)], [("long", 1)]]
    assert seq.num_output_tokens == 2  # sampled after the last chunk and after the decode


def test_prefix_cache_hit_skips_computed_full_blocks(harness_factory: type[Harness]) -> None:
    h = harness_factory(blocks=32, budget=64)
    shared = list(range(100, 109))  # 9 tokens: two full blocks of 4 and one more
    first = make_seq("first", shared)
    h.scheduler.add(first)
    h.step()
    second = make_seq("second", [*shared[:8], 7, 7, 7])
    h.scheduler.add(second)
    out = h.step()
    assert ("second", 3) in plan(out)  # only the tokens after the two cached blocks
    assert second.num_cached_tokens == 8
    assert h.blocks.block_table("second#0")[:2] == h.blocks.block_table("first#0")[:2]


def test_whole_prompt_cached_still_computes_its_last_token(harness_factory: type[Harness]) -> None:
    h = harness_factory(blocks=32, budget=64)
    prompt = list(range(8))  # exactly two blocks
    h.scheduler.add(make_seq("x", prompt))
    h.step()
    again = make_seq("y", prompt)
    h.scheduler.add(again)
    assert ("y", 4) in plan(h.step())  # one block hit; the last block is recomputed for logits
    assert again.num_cached_tokens == 4


def test_out_of_blocks_preempts_the_newest_and_recomputes_it_later(harness_factory: type[Harness]) -> None:
    h = harness_factory(blocks=4, budget=64)
    old, new = make_seq("old", list(range(7)), max_new=20), make_seq("new", list(range(50, 57)), max_new=20)
    h.scheduler.add(old)
    h.scheduler.add(new)
    assert plan(h.step()) == [("old", 7), ("new", 7)]  # 2 blocks each: the pool is full
    assert plan(h.step()) == [("old", 1), ("new", 1)]  # token 8 still fits in the second block
    out = h.step()  # both need a third block for token 9
    assert [s.request.request_id for s in out.preempted] == ["new"]
    assert plan(out) == [("old", 1)]
    assert new.status is Status.WAITING and new.num_computed_tokens == 0 and new.num_preemptions == 1
    assert h.scheduler.num_preemptions == 1  # what turnout_engine_preemptions_total reports
    assert h.scheduler.waiting == [new]
    h.scheduler.remove(old)
    out = h.step()
    # Its blocks were released tail first, so "old" evicted the tail and the head block is still in
    # the prefix cache: of its 9 tokens (prompt + 2 outputs) only the last 5 are recomputed.
    assert plan(out) == [("new", 5)]
    assert new.num_cached_tokens == 0  # cache hits on recompute are not reported as prompt caching


def test_priority_policy_admits_and_preempts_by_priority(harness_factory: type[Harness]) -> None:
    h = harness_factory(blocks=4, budget=64, policy="priority")
    low, high = make_seq("low", list(range(7)), priority=5), make_seq("high", list(range(50, 57)), priority=0)
    h.scheduler.add(low)
    h.scheduler.add(high)
    assert plan(h.step()) == [("high", 7), ("low", 7)]
    h.step()
    out = h.step()
    assert [s.request.request_id for s in out.preempted] == ["low"]


def test_running_cap_limits_admission(harness_factory: type[Harness]) -> None:
    h = harness_factory(blocks=32, budget=64, max_running=2)
    for i in range(3):
        h.scheduler.add(make_seq(f"s{i}", [i, i + 1]))
    assert [rid for rid, _ in plan(h.step())] == ["s0", "s1"]
    assert [s.request.request_id for s in h.scheduler.waiting] == ["s2"]


def test_remove_frees_blocks_of_running_and_waiting(harness_factory: type[Harness]) -> None:
    h = harness_factory(blocks=8, budget=64)
    a, b = make_seq("a", list(range(6))), make_seq("b", list(range(10, 16)))
    h.scheduler.add(a)
    h.step()
    h.scheduler.add(b)
    h.scheduler.remove(a)
    h.scheduler.remove(b)
    assert h.blocks.usage == 0.0 and not h.scheduler.has_work()


def test_sequence_holding_its_last_token_is_released_before_planning(harness_factory: type[Harness]) -> None:
    """With the overlap schedule a sampled token may still be pending (a placeholder); the counts alone say
    the sequence ends by length, so it computes nothing more and its blocks and running slot are reused."""
    h = harness_factory(blocks=3, budget=64, max_running=1)
    done, queued = make_seq("done", list(range(7)), max_new=2), make_seq("queued", list(range(50, 57)))
    h.scheduler.add(done)
    h.scheduler.add(queued)
    assert plan(h.step()) == [("done", 7)]  # 2 blocks; the running cap holds "queued" back
    done.token_ids.append(placeholder(0))  # its second and last token, still on the device
    assert done.is_ending and not done.is_finished
    out = h.scheduler.schedule()
    assert plan(out) == [("queued", 7)] and not out.preempted  # admitted on the blocks "done" gave back
    assert h.blocks.block_table("done#0") == [] and h.scheduler.running == [queued]
    h.scheduler.remove(done)  # the engine finishes it once its token is collected
    assert done.is_finished and h.scheduler.running == [queued]


def test_aborted_waiting_sequence_is_passed_over(harness_factory: type[Harness]) -> None:
    h = harness_factory(blocks=32, budget=64)
    first, second = make_seq("first", [1, 2, 3]), make_seq("second", [4, 5, 6])
    h.scheduler.add(first)
    h.scheduler.add(second)
    first.abort_message = "client left"
    assert plan(h.step()) == [("second", 3)]
    assert h.scheduler.waiting == [first] and h.blocks.block_table("first#0") == []


def test_commit_skips_a_sequence_finished_while_its_step_ran(harness_factory: type[Harness]) -> None:
    h = harness_factory(blocks=32, budget=64)
    a, b = make_seq("a", list(range(5))), make_seq("b", list(range(10, 15)))
    h.scheduler.add(a)
    h.scheduler.add(b)
    out = h.scheduler.schedule()
    h.scheduler.remove(a)  # stopped on its previous token while this step ran
    h.scheduler.commit(out)
    assert a.num_computed_tokens == 0 and b.num_computed_tokens == 5


def test_prompts_sharing_a_prefix_that_this_step_computes_wait_for_it_then_hit(
    harness_factory: type[Harness],
) -> None:
    h = harness_factory(blocks=64, budget=64)
    shared = list(range(100, 112))  # three full blocks of 4
    first, second = make_seq("first", [*shared, 1, 2]), make_seq("second", [*shared, 3, 4, 5])
    other = make_seq("other", list(range(200, 210)))
    for seq in (first, second, other):
        h.scheduler.add(seq)
    # second would compute first's three blocks again: it waits; other, sharing nothing, goes ahead.
    assert plan(h.step()) == [("first", 14), ("other", 10)]
    assert plan(h.step()) == [("first", 1), ("other", 1), ("second", 3)]
    assert second.num_cached_tokens == 12
    assert h.blocks.block_table("second#0")[:3] == h.blocks.block_table("first#0")[:3]


def test_a_shared_prefix_is_computed_once_per_step_only_with_prefix_caching(harness_factory: type[Harness]) -> None:
    h = harness_factory(blocks=64, budget=64)
    h.blocks.enable_prefix_caching = False
    prompts = [[*range(100, 112), tail] for tail in (1, 2)]
    for i, prompt in enumerate(prompts):
        h.scheduler.add(make_seq(f"s{i}", prompt))
    assert plan(h.step()) == [("s0", 13), ("s1", 13)]


def test_a_prompt_equal_to_one_being_computed_is_not_held_back(harness_factory: type[Harness]) -> None:
    # Its only shareable blocks are the ones match_prefix could hit; with a 5-token prompt that is one
    # block, which first computes this step: so it waits once, then computes just its last token.
    h = harness_factory(blocks=64, budget=64)
    first, again = make_seq("first", list(range(5))), make_seq("again", list(range(5)))
    h.scheduler.add(first)
    h.scheduler.add(again)
    assert plan(h.step()) == [("first", 5)]
    assert plan(h.step()) == [("first", 1), ("again", 1)]
    # A 4-token prompt has no block match_prefix could hit (its last token is always computed): no wait.
    h2 = harness_factory(blocks=64, budget=64)
    for rid in ("a", "b"):
        h2.scheduler.add(make_seq(rid, list(range(4))))
    assert plan(h2.step()) == [("a", 4), ("b", 4)]


def test_a_fork_at_a_partial_block_copies_it_and_decodes_at_once(harness_factory: type[Harness]) -> None:
    """A beam forked from a parent mid-block (beam_search.py) shares its full blocks, gets a copy of the
    partial one, and computes only its new token; without a copy it recomputes the partial block."""
    h = harness_factory(blocks=16, budget=32)
    parent = make_seq("p", list(range(6)))
    h.scheduler.add(parent)
    h.step()  # prefill: 6 tokens computed, the 7th sampled
    copies: list[tuple[int, int]] = []
    child = Sequence(parent.request, index=1, token_ids=[*parent.token_ids[:-1], 77])
    h.scheduler.add_fork(parent, child, num_tokens=6, copy_block=lambda src, dst: copies.append((src, dst)))
    parent_table = h.blocks.block_table("p#0")
    assert copies == [(parent_table[1], h.blocks.block_table("p#1")[1])]
    assert h.blocks.block_table("p#1")[0] == parent_table[0] and child.num_computed_tokens == 6
    recomputing = Sequence(parent.request, index=2, token_ids=[*parent.token_ids[:-1], 78])
    h.scheduler.add_fork(parent, recomputing, num_tokens=6)
    assert recomputing.num_computed_tokens == 4
    assert plan(h.step()) == [("p", 1), ("p", 1), ("p", 3)]


def test_a_running_sequence_with_nothing_to_compute_is_not_scheduled(harness_factory: type[Harness]) -> None:
    """A beam whose logits are in, waiting for its siblings' (beam_search.py), sits out the step."""
    h = harness_factory(blocks=16, budget=32)
    a, b = make_seq("a", list(range(5))), make_seq("b", list(range(20, 25)))
    for seq in (a, b):
        h.scheduler.add(seq)
    h.step()
    a.token_ids.pop()  # as if a's sampled token were not appended yet: all its tokens computed
    assert plan(h.step()) == [("b", 1)]
