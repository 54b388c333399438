"""Feeding a text to a streaming parser in every way it can arrive: whole, in every 2 or 3 pieces, char by char."""

from __future__ import annotations

import itertools
from collections.abc import Iterator


def splits(text: str) -> Iterator[list[str]]:
    yield [text]
    yield list(text) or [""]
    for i, j in itertools.combinations_with_replacement(range(len(text) + 1), 2):
        yield [text[:i], text[i:j], text[j:]]
