"""The cache-aware policy's prefix tree: matching, edge splits, the size bound, LRU eviction order."""

from __future__ import annotations

import random

import pytest

from services.router.prefix_tree import PrefixTree


def test_match_is_the_longest_remembered_prefix() -> None:
    tree = PrefixTree(1000)
    assert tree.match([1, 2, 3]) == 0
    tree.insert([1, 2, 3, 4, 5])
    assert tree.match([1, 2, 3, 4, 5, 6]) == 5
    assert tree.match([1, 2, 3, 9]) == 3
    assert tree.match([2, 3]) == 0
    assert tree.match([]) == 0
    tree.check_integrity()


def test_insert_splits_edges_and_counts_each_token_once() -> None:
    tree = PrefixTree(1000)
    tree.insert([1, 2, 3, 4])
    tree.insert([1, 2, 7, 8, 9])  # splits [1,2,3,4] after two tokens
    tree.insert([1, 2])  # already there: nothing new
    tree.insert([1, 2, 3, 4])
    assert tree.size == 4 + 3
    assert tree.match([1, 2, 7, 8]) == 4
    assert tree.match([1, 2, 3, 4, 5]) == 4
    tree.check_integrity()


def test_bound_evicts_least_recently_used_branch_first() -> None:
    tree = PrefixTree(30, evict_to=0.9)
    a, b, c = [1] * 10, [2] * 10, [3] * 10
    tree.insert(a)
    tree.insert(b)
    tree.insert(c)
    tree.insert(a)  # a is now more recent than b
    tree.insert([4] * 5)  # 35 tokens > 30: evict down to 27 -> b (oldest) goes, then c
    tree.check_integrity()
    assert tree.match(b) == 0
    assert tree.match(a) == 10
    assert tree.match([4] * 5) == 5
    assert tree.size <= 27


def test_a_shared_prefix_outlives_its_evicted_branches() -> None:
    tree = PrefixTree(20, evict_to=0.6)
    tree.insert([9, 9, 9, 1, 1, 1, 1, 1])
    tree.insert([9, 9, 9, 2, 2, 2, 2, 2])
    tree.insert([9, 9, 9, 3, 3, 3, 3, 3, 3, 3, 3])  # 3 + 5 + 5 + 8 = 21 > 20
    tree.check_integrity()
    # The two older leaves go first; the parent [9, 9, 9] stays while the newest leaf uses it.
    assert tree.match([9, 9, 9, 3, 3]) == 5
    assert tree.match([9, 9, 9, 1]) == 3
    assert tree.size == 11


@pytest.mark.parametrize("seed", range(3))
def test_random_inserts_keep_every_invariant(seed: int) -> None:
    rng = random.Random(seed)
    tree = PrefixTree(500)
    prompts = []
    for _ in range(300):
        base = rng.choice(prompts) if prompts and rng.random() < 0.6 else []
        prompt = base[: rng.randint(0, len(base))] + [rng.randrange(8) for _ in range(rng.randint(1, 40))]
        prompts.append(prompt)
        tree.insert(prompt)
        tree.check_integrity()
        assert tree.match(prompt) == len(prompt) or tree.size > tree.max_tokens * 0.8
