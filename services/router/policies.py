"""Routing policies: which routable engine gets the next request.

A policy sees the routable engines (in pool order: "index" below) and the
prompt's token ids, and returns the engine with the reason it was chosen (a
metrics label). Load is `EngineClient.load`: the router's in-flight streams on
the engine plus the requests the engine reported beyond them.

| policy         | picks                                                                |
| -------------- | -------------------------------------------------------------------- |
| `round_robin`  | the next engine in turn                                              |
| `random`       | a uniformly random engine                                            |
| `power_of_two` | the less loaded of two random engines (KV usage, then index on ties) |
| `least_load`   | the least loaded engine (KV usage, then index on ties)               |
| `cache_aware`  | see `CacheAware`                                                     |

Ties go to the lowest index on purpose: a router that never counted load
would then send everything to the first engine, which the tests catch.
"""

from __future__ import annotations

import itertools
import random
import zlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from services.router.prefix_tree import PrefixTree

if TYPE_CHECKING:
    from services.router.config import RouterConfig
    from services.router.engine_pool import EngineClient


@dataclass(frozen=True)
class Route:
    engine: EngineClient
    reason: str


def _load_key(engine: EngineClient) -> tuple[int, float]:
    return engine.load, engine.reported.kv_cache_usage


class Policy(ABC):
    name: ClassVar[str]

    @abstractmethod
    def pick(self, engines: Sequence[EngineClient], input_ids: Sequence[int]) -> Route:
        """Choose one of `engines` (never empty) for a prompt."""

    def forget(self, address: str) -> None:  # noqa: B027 (most policies keep no per-engine state)
        """The engine at `address` left the pool."""

    def remembered_tokens(self, address: str) -> int:
        """Prompt tokens the policy remembers for an engine (cache-aware only)."""
        return 0


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def pick(self, engines: Sequence[EngineClient], input_ids: Sequence[int]) -> Route:
        return Route(engines[next(self._turn) % len(engines)], self.name)


class Random(Policy):
    name = "random"

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def pick(self, engines: Sequence[EngineClient], input_ids: Sequence[int]) -> Route:
        return Route(self._rng.choice(engines), self.name)


class PowerOfTwo(Policy):
    name = "power_of_two"

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def pick(self, engines: Sequence[EngineClient], input_ids: Sequence[int]) -> Route:
        if len(engines) == 1:
            return Route(engines[0], self.name)
        i, j = sorted(self._rng.sample(range(len(engines)), 2))
        better = engines[j] if _load_key(engines[j]) < _load_key(engines[i]) else engines[i]
        return Route(better, self.name)


class LeastLoad(Policy):
    name = "least_load"

    def pick(self, engines: Sequence[EngineClient], input_ids: Sequence[int]) -> Route:
        return Route(min(engines, key=_load_key), self.name)  # min() keeps the first of equals


class CacheAware(Policy):
    """Send prompts that share a prefix to the engine that has probably cached it.

    1. Imbalanced (max load - min load > `balance_abs_threshold` and max load >
       min load * `balance_rel_threshold`): the least loaded engine ("imbalanced").
    2. Otherwise the engine whose tree holds the longest prefix of the prompt
       (ties: lower load, then lower index), if that prefix covers more than
       `cache_threshold` of the prompt ("cache_hit").
    3. Otherwise the least loaded engine, ties to the one remembering the fewest
       tokens (so new prefixes spread over the engines), then the lower index
       ("cache_miss").

    The prompt is then inserted into the chosen engine's tree. Trees are bounded
    to `max_tree_size` tokens each, least recently used branches evicted first.
    """

    name = "cache_aware"

    def __init__(self, cache_threshold: float, abs_threshold: int, rel_threshold: float, max_tree_size: int) -> None:
        self.cache_threshold = cache_threshold
        self.abs_threshold = abs_threshold
        self.rel_threshold = rel_threshold
        self.max_tree_size = max_tree_size
        self._trees: dict[str, PrefixTree] = {}

    def tree(self, address: str) -> PrefixTree:
        tree = self._trees.get(address)
        if tree is None:
            tree = self._trees[address] = PrefixTree(self.max_tree_size)
        return tree

    def pick(self, engines: Sequence[EngineClient], input_ids: Sequence[int]) -> Route:
        loads = [e.load for e in engines]
        low, high = min(loads), max(loads)
        if high - low > self.abs_threshold and high > low * self.rel_threshold:
            route = Route(min(engines, key=_load_key), "imbalanced")
        else:
            matches = [self.tree(e.address).match(input_ids) for e in engines]
            best = max(range(len(engines)), key=lambda i: (matches[i], -loads[i], -i))
            if input_ids and matches[best] / len(input_ids) > self.cache_threshold:
                route = Route(engines[best], "cache_hit")
            else:
                fewest = min(range(len(engines)), key=lambda i: (loads[i], self.tree(engines[i].address).size, i))
                route = Route(engines[fewest], "cache_miss")
        self.tree(route.engine.address).insert(input_ids)
        return route

    def forget(self, address: str) -> None:
        self._trees.pop(address, None)

    def remembered_tokens(self, address: str) -> int:
        tree = self._trees.get(address)
        return tree.size if tree is not None else 0


def routing_key(input_ids: Sequence[int], lora_name: str) -> list[int]:
    """What a policy sees of a prompt: its token ids, led for a LoRA adapter's request by a marker of
    the adapter (a negative id no real token has), so the same prompt under another adapter, or the
    base model, shares no prefix with it: an adapter's K/V differ, and the engines cache them apart."""
    if not lora_name:
        return list(input_ids)
    return [-1 - zlib.crc32(lora_name.encode()), *input_ids]


def make_policy(config: RouterConfig) -> Policy:
    if config.policy == CacheAware.name:
        return CacheAware(
            config.cache_threshold,
            config.balance_abs_threshold,
            config.balance_rel_threshold,
            config.max_tree_size,
        )
    simple: dict[str, type[Policy]] = {p.name: p for p in (RoundRobin, Random, PowerOfTwo, LeastLoad)}
    return simple[config.policy]()
