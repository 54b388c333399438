"""SGLang's cumulative /generate events, encoded incrementally, are byte for byte what json.dumps gives."""

from __future__ import annotations

import json
import random
from typing import Any

from gateway.cumulative_json import CumulativeEvents

# Characters JSON escapes (quote, backslash, controls), multi-byte ones, a lone surrogate and a line separator.
ALPHABET = ['"', "\\", "\n", "\t", "\x00", "\x1f", "/", "a", " ", "é", "日本", "🙂", "\ud800", "\u2028", "</s>"]


def _expected(text: str, ids: list[int], rest: dict[str, Any]) -> str:
    return json.dumps({"text": text, "output_ids": ids, **rest}, ensure_ascii=False, separators=(",", ":"))


def test_growing_samples_encode_as_json_dumps_does() -> None:
    rng = random.Random(7)
    encoded = CumulativeEvents()
    texts = {0: "", 1: ""}
    ids: dict[int, list[int]] = {0: [], 1: []}
    for step in range(300):
        key = rng.randrange(2)
        texts[key] += "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(4)))  # steps may add no text
        ids[key].extend(rng.randrange(-5, 200_000) for _ in range(rng.randrange(3)))
        rest = {"meta_info": {"id": f"r-{key}", "completion_tokens": len(ids[key]), "e2e_latency": step / 7}}
        if step % 3:
            rest["index"] = key
        assert encoded.encode(key, texts[key], ids[key], rest) == _expected(texts[key], ids[key], rest)


def test_text_or_ids_that_do_not_extend_the_last_ones_are_encoded_whole() -> None:
    encoded = CumulativeEvents()
    ids = [1, 2, 3]
    assert encoded.encode(0, "hello wor", ids, {}) == _expected("hello wor", ids, {})
    # Shorter text (not an extension), a new list, and then the old list shrunk in place.
    assert encoded.encode(0, "hello", [1, 2], {}) == _expected("hello", [1, 2], {})
    other = [9]
    assert encoded.encode(0, 'he said "x"', other, {}) == _expected('he said "x"', other, {})
    other.clear()
    assert encoded.encode(0, "", other, {"meta_info": None}) == _expected("", other, {"meta_info": None})
