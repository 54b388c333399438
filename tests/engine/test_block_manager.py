"""BlockManager on tiny pools (8 blocks of 4 tokens unless said), asserting exact block ids and eviction order."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest

from services.engine import block_pool
from services.engine.block_manager import BlockManager, PrefixCacheStats

Factory = Callable[..., BlockManager]


@pytest.fixture
def make() -> Iterator[Factory]:
    """Builds managers and checks the integrity of every one of them when the test ends."""
    made: list[BlockManager] = []

    def factory(num_blocks: int = 8, block_size: int = 4, enable_prefix_caching: bool = True) -> BlockManager:
        bm = BlockManager(num_blocks, block_size, enable_prefix_caching)
        made.append(bm)
        return bm

    yield factory
    for bm in made:
        bm.check_integrity()


@pytest.fixture
def bm(make: Factory) -> BlockManager:
    return make()


@pytest.fixture
def collide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every block hashes the same, so only the token comparison tells prefixes apart."""
    monkeypatch.setattr(block_pool, "_hash_block", lambda parent_hash, tokens: 7)


def compute(bm: BlockManager, seq: str, tokens: list[int]) -> list[int]:
    """Match, allocate and cache the whole sequence, as the scheduler does for a prefill; its block table."""
    bm.match_prefix(seq, tokens)
    assert bm.allocate(seq, len(tokens))
    bm.cache_full_blocks(seq, tokens, len(tokens))
    return bm.block_table(seq)


def test_blocks_needed_rounds_up() -> None:
    bm = BlockManager(8, 4)
    assert [bm.blocks_needed(n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_allocation_takes_the_lowest_free_ids_in_order(bm: BlockManager) -> None:
    assert bm.allocate("a", 5)
    assert bm.allocate("b", 4)
    assert (bm.block_table("a"), bm.block_table("b")) == ([0, 1], [2])
    assert (bm.num_free_blocks, bm.num_total_blocks, bm.usage) == (5, 8, 3 / 8)


def test_allocate_grows_across_a_block_boundary_and_never_shrinks(bm: BlockManager) -> None:
    assert bm.allocate("a", 4)
    assert bm.allocate("a", 4)
    assert bm.block_table("a") == [0]
    assert bm.allocate("b", 1)
    assert bm.allocate("a", 5)  # the 5th token opens a second block
    assert bm.block_table("a") == [0, 2]
    assert bm.allocate("a", 1)
    assert bm.block_table("a") == [0, 2]


def test_failed_allocate_changes_nothing(bm: BlockManager) -> None:
    compute(bm, "cached", list(range(8)))
    bm.free("cached")  # blocks 0, 1 evictable
    assert bm.allocate("a", 20)  # blocks 2..6
    assert not bm.allocate("b", 16)  # 4 needed, 3 available (1 free + 2 evictable)
    assert not bm.allocate("a", 36)  # 4 more needed
    assert bm.block_table("a") == [2, 3, 4, 5, 6]
    assert bm.block_table("b") == []
    assert bm.num_free_blocks == 3
    assert bm.stats.num_evicted_blocks == 0
    assert bm.match_prefix("c", list(range(9))) == 8  # nothing was evicted


def test_match_prefix_hits_full_blocks_only_and_never_the_whole_sequence(bm: BlockManager) -> None:
    tokens = list(range(10))
    assert compute(bm, "a", tokens) == [0, 1, 2]  # blocks 0, 1 full and cached; block 2 holds 2 tokens
    assert bm.match_prefix("b", tokens) == 8  # the partial third block is not matched
    assert bm.block_table("b") == [0, 1]
    assert bm.match_prefix("c", tokens[:9]) == 8
    assert bm.match_prefix("d", tokens[:8]) == 4  # all 8 tokens cached, but one must be computed
    assert bm.block_table("d") == [0]
    assert bm.match_prefix("e", [0, 1, 2, 3, 99, 5, 6, 7, 8]) == 4  # diverges in the second block
    assert bm.match_prefix("f", [9, *tokens]) == 0
    assert bm.block_table("f") == []
    assert bm.match_prefix("g", []) == 0


def test_sequences_sharing_a_prefix_share_block_ids(bm: BlockManager) -> None:
    prompt = list(range(8))
    assert compute(bm, "a", [*prompt, 100, 101]) == [0, 1, 2]
    assert compute(bm, "b", [*prompt, 200]) == [0, 1, 3]
    assert [bm.ref_count(b) for b in range(4)] == [2, 2, 1, 1]
    assert bm.usage == 4 / 8
    bm.free("a")
    assert [bm.ref_count(b) for b in range(4)] == [1, 1, 0, 1]
    assert bm.num_free_blocks == 5


def test_free_releases_tail_first_so_the_tail_is_evicted_first(bm: BlockManager) -> None:
    tokens = list(range(12))
    assert compute(bm, "a", tokens) == [0, 1, 2]
    bm.free("a")
    assert bm.num_free_blocks == 8 and bm.usage == 0
    assert bm.allocate("filler", 20) and bm.block_table("filler") == [3, 4, 5, 6, 7]
    assert bm.allocate("x", 1) and bm.block_table("x") == [2]  # the tail, released first
    assert bm.stats.num_evicted_blocks == 1
    assert bm.match_prefix("b", [*tokens, 12]) == 8  # the head is still cached
    assert bm.block_table("b") == [0, 1]


def test_eviction_takes_the_least_recently_released_block_first(bm: BlockManager) -> None:
    compute(bm, "a", [1, 1, 1, 1])
    compute(bm, "b", [2, 2, 2, 2])
    bm.free("b")
    bm.free("a")  # released last: evicted last
    assert bm.allocate("filler", 24) and bm.block_table("filler") == [2, 3, 4, 5, 6, 7]
    assert bm.allocate("x", 1) and bm.block_table("x") == [1]
    assert bm.match_prefix("c", [1, 1, 1, 1, 0]) == 4
    assert bm.match_prefix("d", [2, 2, 2, 2, 0]) == 0


def test_only_unreferenced_blocks_are_evicted(bm: BlockManager) -> None:
    compute(bm, "alive", list(range(8)))
    compute(bm, "done", list(range(100, 108)))
    bm.free("done")
    assert bm.allocate("filler", 16) and bm.block_table("filler") == [4, 5, 6, 7]
    assert not bm.allocate("x", 12)  # only the 2 blocks of "done" may go
    assert bm.allocate("x", 8) and bm.block_table("x") == [3, 2]
    assert [bm.ref_count(b) for b in (0, 1)] == [1, 1]
    assert bm.match_prefix("y", list(range(9))) == 8


def test_a_hit_on_an_evictable_block_revives_it(bm: BlockManager) -> None:
    compute(bm, "a", list(range(8)))
    bm.free("a")
    assert bm.num_free_blocks == 8
    assert bm.match_prefix("b", list(range(9))) == 8
    assert (bm.num_free_blocks, bm.ref_count(0), bm.ref_count(1)) == (6, 1, 1)
    assert bm.allocate("filler", 24)
    assert not bm.allocate("x", 1)  # the revived blocks are referenced again, not evictable
    assert bm.block_table("b") == [0, 1]


def test_identical_prefix_computed_concurrently_keeps_the_first_cached_copy(bm: BlockManager) -> None:
    tokens = list(range(12))
    assert bm.match_prefix("a", tokens) == 0 and bm.match_prefix("b", tokens) == 0
    assert bm.allocate("a", 12) and bm.allocate("b", 12)
    assert (bm.block_table("a"), bm.block_table("b")) == ([0, 1, 2], [3, 4, 5])
    bm.cache_full_blocks("a", tokens, 8)  # blocks 0, 1
    bm.cache_full_blocks("b", tokens, 12)  # 3, 4 duplicate 0, 1 and stay uncached; 5 is new
    assert bm.match_prefix("c", [*tokens, 99]) == 12
    assert bm.block_table("c") == [0, 1, 5]  # b's third block chains onto a's cached copies
    bm.free("b")  # 4, 3 go back to free; 5 is still referenced by c
    assert bm.allocate("filler", 12) and bm.block_table("filler") == [6, 7, 4]
    bm.free("a")
    bm.free("c")
    assert bm.match_prefix("d", [*tokens, 99]) == 12
    assert bm.block_table("d") == [0, 1, 5]


def test_hash_collision_never_returns_another_prefix(bm: BlockManager, collide: None) -> None:
    assert compute(bm, "a", [1, 2, 3, 4, 5, 6, 7, 8]) == [0, 1]
    assert bm.match_prefix("b", [9, 9, 9, 9, 0]) == 0  # same hash, different tokens
    bm.free("b")
    # Same tokens in the second block, but after a different (colliding) first block: its K/V differ.
    assert compute(bm, "c", [9, 9, 9, 9, 5, 6, 7, 8]) == [2, 3]
    assert bm.match_prefix("d", [1, 2, 3, 4, 5, 6, 7, 8, 0]) == 8
    assert bm.block_table("d") == [0, 1]
    assert bm.match_prefix("e", [9, 9, 9, 9, 5, 6, 7, 8, 0]) == 8
    assert bm.block_table("e") == [2, 3]


def test_reset_prefix_cache_is_refused_while_blocks_are_referenced(bm: BlockManager) -> None:
    compute(bm, "a", list(range(8)))
    compute(bm, "b", list(range(100, 104)))
    bm.free("b")
    assert not bm.reset_prefix_cache()
    assert bm.match_prefix("c", [100, 101, 102, 103, 0]) == 4  # still cached
    bm.free("a")
    bm.free("c")
    assert bm.reset_prefix_cache()
    assert bm.num_free_blocks == 8
    assert bm.match_prefix("d", list(range(9))) == 0
    assert bm.allocate("d", 32)
    assert bm.stats.num_evicted_blocks == 0  # everything went back to free, nothing is evicted


def test_with_prefix_caching_off_nothing_is_cached(make: Factory) -> None:
    bm = make(enable_prefix_caching=False)
    tokens = list(range(12))
    assert compute(bm, "a", tokens) == [0, 1, 2]
    bm.free("a")
    assert bm.match_prefix("b", [*tokens, 0]) == 0
    assert bm.allocate("b", 32)
    assert bm.block_table("b") == [3, 4, 5, 6, 7, 2, 1, 0]  # freed blocks went straight back to free
    assert bm.stats == PrefixCacheStats(0, 0, 0, 0)


def test_stats_count_queried_and_hit_tokens(bm: BlockManager) -> None:
    compute(bm, "a", list(range(10)))
    compute(bm, "b", list(range(10)))
    stats = bm.stats
    assert stats == PrefixCacheStats(num_queries=2, num_query_tokens=20, num_hit_tokens=8, num_evicted_blocks=0)
    assert stats.hit_rate == 8 / 20
    with pytest.raises(AttributeError):
        stats.num_queries = 0  # type: ignore[misc]


def test_misuse_is_refused(bm: BlockManager) -> None:
    bm.free("unknown")  # a no-op
    assert bm.allocate("a", 4)
    with pytest.raises(ValueError, match="already has blocks"):
        bm.match_prefix("a", [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="computed tokens"):
        bm.cache_full_blocks("a", list(range(8)), 8)  # only one block allocated
    with pytest.raises(ValueError):
        BlockManager(0, 4)
    with pytest.raises(ValueError):
        BlockManager(8, 0)


def _corrupt_ref(bm: BlockManager) -> None:
    bm._pool._ref[0] += 1


def _corrupt_table_twice(bm: BlockManager) -> None:
    bm._tables["a"].append(0)
    bm._pool._ref[0] += 1


def _corrupt_free_in_use(bm: BlockManager) -> None:
    bm._tables["a"].append(bm._pool._free[0])


def _corrupt_lose_block(bm: BlockManager) -> None:
    bm._pool._free.pop()


def _corrupt_index(bm: BlockManager) -> None:
    key = next(iter(bm._pool._index))
    bm._pool._index[key] = 7


def _corrupt_evictable_referenced(bm: BlockManager) -> None:
    bm._pool._evictable[0] = None


def _corrupt_free_keyed(bm: BlockManager) -> None:
    bm._pool._keys[bm._pool._free[0]] = next(iter(bm._pool._index))


def _corrupt_evictable_unkeyed(bm: BlockManager) -> None:
    bm._pool._evictable[bm._pool._free.pop()] = None


def _corrupt_cached_with_caching_off(bm: BlockManager) -> None:
    bm.enable_prefix_caching = False


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (_corrupt_ref, "ref count 2 but 1 block-table entries"),
        (_corrupt_table_twice, "block twice"),
        (_corrupt_free_in_use, "free blocks with ref > 0|ref count 0 but 1"),
        (_corrupt_lose_block, "lost blocks: \\[7\\]"),
        (_corrupt_index, "index entry"),
        (_corrupt_evictable_referenced, "evictable blocks with ref > 0"),
        (_corrupt_free_keyed, "free block 3 still has a prefix-cache key"),
        (_corrupt_evictable_unkeyed, "evictable block 7 has no prefix-cache key"),
        (_corrupt_cached_with_caching_off, "prefix caching is off"),
    ],
)
def test_check_integrity_catches_corruption(corrupt: Callable[[BlockManager], None], message: str) -> None:
    bm = BlockManager(8, 4)
    compute(bm, "a", list(range(9)))
    bm.check_integrity()
    corrupt(bm)
    with pytest.raises(AssertionError, match=message):
        bm.check_integrity()


@pytest.mark.parametrize(
    ("enable_prefix_caching", "colliding_hash"), [(True, False), (True, True), (False, False)], ids=str
)
def test_random_interleaving_keeps_every_invariant(
    enable_prefix_caching: bool, colliding_hash: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sequences from a few shared stems run prefill chunks, decode, get preempted and finish at random.
    A model of the physical cache records which tokens each block's K/V were computed from: a prefix hit
    must return blocks holding exactly the asked prefix, and a block written must be owned by one sequence."""
    if colliding_hash:
        monkeypatch.setattr(block_pool, "_hash_block", lambda parent_hash, tokens: sum(tokens) % 3)
    rng = random.Random(1234)
    bs = 4
    bm = BlockManager(24, bs, enable_prefix_caching)
    stems = [[rng.randrange(3) for _ in range(rng.randrange(1, 14))] for _ in range(4)]
    content: dict[int, tuple[int, ...]] = {}  # block -> the sequence prefix its K/V were computed from
    seqs: dict[str, tuple[list[int], int]] = {}  # seq -> (tokens, num_computed_tokens)
    hits = 0

    for step in range(1500):
        op = rng.random()
        if op < 0.2 or not seqs:
            seq = f"s{step}"
            tokens = rng.choice(stems) + [rng.randrange(3) for _ in range(rng.randrange(1, 10))]
            computed = bm.match_prefix(seq, tokens)
            table = bm.block_table(seq)
            assert computed == len(table) * bs < len(tokens)
            for j, block in enumerate(table):
                assert content[block] == tuple(tokens[: (j + 1) * bs]), f"hit on block {block} of another prefix"
            hits += computed
            seqs[seq] = (tokens, computed)
        elif op < 0.85:
            seq = rng.choice(sorted(seqs))
            tokens, computed = seqs[seq]
            if computed == len(tokens):
                tokens.append(rng.randrange(3))  # decode: the sampled token joins the sequence
            target = min(len(tokens), computed + rng.randrange(1, 9))  # a prefill chunk or one decode token
            before, free_before = bm.block_table(seq), bm.num_free_blocks
            if not bm.allocate(seq, target):
                assert (bm.block_table(seq), bm.num_free_blocks) == (before, free_before)
                bm.free(seq)  # preempted: recomputed from scratch later
                del seqs[seq]
                bm.check_integrity()
                continue
            table = bm.block_table(seq)
            for j in range(computed // bs, (target - 1) // bs + 1):  # write K/V of positions computed..target-1
                assert bm.ref_count(table[j]) == 1 and bm._pool.key(table[j]) is None
                content[table[j]] = tuple(tokens[: min(target, (j + 1) * bs)])
            bm.cache_full_blocks(seq, tokens, target)
            seqs[seq] = (tokens, target)
        elif op < 0.99:
            seq = rng.choice(sorted(seqs))
            bm.free(seq)
            del seqs[seq]
        elif bm.reset_prefix_cache():
            assert bm.num_free_blocks == bm.num_total_blocks
        bm.check_integrity()

    assert (hits > 100) == enable_prefix_caching
    assert (bm.stats.num_evicted_blocks > 50) == enable_prefix_caching
    assert bm.stats.num_hit_tokens == hits
    for seq in list(seqs):
        bm.free(seq)
    bm.check_integrity()
    assert bm.usage == 0 and bm.num_free_blocks == 24


@pytest.mark.parametrize("hashes", ["real", "colliding"])
def test_a_salt_keeps_the_same_tokens_apart(bm: BlockManager, hashes: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A LoRA adapter's K/V differ from the base model's for the same tokens: the sequence's salt (its
    adapter) is part of every block key, so only the same salt hits (also when every hash collides)."""
    if hashes == "colliding":
        monkeypatch.setattr(block_pool, "_hash_block", lambda parent_hash, tokens: 7)
    tokens = list(range(9))  # two full blocks of 4, one token left to compute
    assert bm.allocate("a", 9)
    bm.cache_full_blocks("a", tokens, 8, salt=1)
    assert bm.match_prefix("base", tokens) == 0
    assert bm.match_prefix("other", tokens, salt=2) == 0
    assert bm.match_prefix("same", tokens, salt=1) == 8
    assert bm.block_table("same") == bm.block_table("a")[:2]
    assert bm.keys_of_new_blocks("base", tokens, 8) != bm.keys_of_new_blocks("other", tokens, 8, salt=2)
    for seq in ("a", "base", "other", "same"):
        bm.free(seq)


def test_copy_tail_gives_a_fork_its_own_partial_block(make: Factory) -> None:
    bm = make(num_blocks=5, enable_prefix_caching=False)
    tokens = list(range(10))  # blocks 0, 1 full; block 2 holds 2 tokens
    assert compute(bm, "parent", tokens) == [0, 1, 2]
    assert bm.fork("parent", "child", len(tokens)) == 8
    assert bm.copy_tail("parent", "child") == (2, 3)  # copy block 2's K/V into the child's block 3
    assert bm.block_table("child") == [0, 1, 3]
    assert [bm.ref_count(b) for b in range(4)] == [2, 2, 1, 1]
    # Nothing left to copy once the child has it; no block free: None, nothing changed.
    assert bm.copy_tail("parent", "child") is None
    assert bm.fork("parent", "second", len(tokens)) == 8 and bm.allocate("other", 4)
    assert bm.copy_tail("parent", "second") is None and bm.block_table("second") == [0, 1]
