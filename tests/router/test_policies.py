"""Routing policies on stand-in engines: what each picks, and how ties break."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest

from services.router.config import RouterConfig
from services.router.policies import CacheAware, LeastLoad, PowerOfTwo, Random, RoundRobin, make_policy
from turnout.v1 import engine_pb2


@dataclass
class Stub:
    """What a policy reads from an EngineClient."""

    address: str
    load: int = 0
    reported: engine_pb2.Load = field(default_factory=engine_pb2.Load)


def stubs(n: int = 3) -> list[Any]:
    return [Stub(f"10.0.0.{i}:1") for i in range(n)]


def test_round_robin_takes_turns() -> None:
    engines = stubs()
    policy = RoundRobin()
    picks = [policy.pick(engines, [1]).engine.address for _ in range(6)]
    assert picks == [e.address for e in engines] * 2


def test_random_uses_every_engine() -> None:
    engines = stubs()
    policy = Random(random.Random(0))
    assert {policy.pick(engines, [1]).engine.address for _ in range(50)} == {e.address for e in engines}


def test_least_load_picks_the_least_loaded_then_kv_usage_then_the_first() -> None:
    engines = stubs()
    policy = LeastLoad()
    assert policy.pick(engines, [1]).engine is engines[0]  # all equal: the first
    engines[0].load = 2
    engines[1].load = 1
    engines[2].load = 1
    engines[1].reported = engine_pb2.Load(kv_cache_usage=0.5)
    assert policy.pick(engines, [1]).engine is engines[2]


def test_power_of_two_never_picks_the_most_loaded_of_its_pair() -> None:
    engines = stubs()
    engines[0].load, engines[1].load, engines[2].load = 5, 0, 3
    policy = PowerOfTwo(random.Random(1))
    picks = Counter(policy.pick(engines, [1]).engine.address for _ in range(200))
    assert engines[0].address not in picks  # it loses against either other engine
    assert picks[engines[1].address] > picks[engines[2].address] > 0


def test_power_of_two_with_one_engine() -> None:
    engines = stubs(1)
    assert PowerOfTwo().pick(engines, [1]).engine is engines[0]


def cache_aware(**kwargs: Any) -> CacheAware:
    settings = {"cache_threshold": 0.5, "abs_threshold": 4, "rel_threshold": 1.5, "max_tree_size": 10_000}
    return CacheAware(**{**settings, **kwargs})


def test_cache_aware_sends_a_shared_prefix_to_the_same_engine() -> None:
    engines = stubs()
    policy = cache_aware()
    prefix = list(range(100))
    first = policy.pick(engines, [*prefix, 1])
    assert first.reason == "cache_miss"
    for suffix in range(2, 8):
        route = policy.pick(engines, [*prefix, suffix])
        assert route.engine is first.engine and route.reason == "cache_hit"
    assert policy.remembered_tokens(first.engine.address) == 100 + 7


def test_cache_aware_spreads_new_prefixes_over_the_engines() -> None:
    engines = stubs()
    policy = cache_aware()
    picks = [policy.pick(engines, [k] * 20).engine.address for k in range(6)]
    assert Counter(picks) == Counter({e.address: 2 for e in engines})


def test_cache_aware_below_the_threshold_goes_to_the_least_loaded() -> None:
    engines = stubs()
    policy = cache_aware(cache_threshold=0.5)
    policy.pick(engines, list(range(10)))  # engine 0 remembers 0..9
    engines[0].load = 1
    # A 10-token match of a 30-token prompt is 33% < 50%: not a hit.
    route = policy.pick(engines, [*range(10), *[99] * 20])
    assert route.reason == "cache_miss" and route.engine is engines[1]


def test_cache_aware_ignores_the_cache_when_loads_are_imbalanced() -> None:
    engines = stubs()
    policy = cache_aware(abs_threshold=4, rel_threshold=1.5)
    prefix = list(range(50))
    assert policy.pick(engines, prefix).engine is engines[0]
    engines[0].load = 4  # 4 - 0 is not > 4: still balanced
    assert policy.pick(engines, prefix).reason == "cache_hit"
    engines[0].load = 5  # 5 - 0 > 4 and 5 > 0 * 1.5
    route = policy.pick(engines, prefix)
    assert route.reason == "imbalanced" and route.engine is engines[1]


def test_cache_aware_ties_on_match_go_to_the_lower_load_then_the_first() -> None:
    engines = stubs()
    policy = cache_aware()
    for e in engines:
        policy.tree(e.address).insert([7] * 10)
    assert policy.pick(engines, [7] * 10).engine is engines[0]
    engines[0].load = 1
    assert policy.pick(engines, [7] * 10).engine is engines[1]


def test_forgotten_engine_loses_its_tree() -> None:
    engines = stubs()
    policy = cache_aware()
    policy.pick(engines, [1, 2, 3])
    policy.forget(engines[0].address)
    assert policy.remembered_tokens(engines[0].address) == 0


@pytest.mark.parametrize("name", ["round_robin", "random", "power_of_two", "least_load", "cache_aware"])
def test_make_policy_by_name(name: str) -> None:
    policy = make_policy(RouterConfig(engines=(), tokenizers=("t:1",), policy=name))
    assert policy.name == name
