"""Feeding a text to a streaming parser in every way it can arrive: whole, in every 2 or 3 pieces, char by char."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator


def splits(text: str) -> Iterator[list[str]]:
    yield [text]
    yield list(text) or [""]
    for i, j in itertools.combinations_with_replacement(range(len(text) + 1), 2):
        yield [text[:i], text[i:j], text[j:]]


def cut(text: str, points: Iterable[int]) -> list[str]:
    """`text` cut at the given positions (any order, repeats allowed: empty pieces)."""
    bounds = [0, *sorted(p % (len(text) + 1) for p in points), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]
