"""OpenAI stream chunks that differ from the one before only in their text, encoded at the cost of the
text.

A streamed chunk repeats the response's id, object, created and model, and its choice's index and ending
fields; most chunks of a stream differ only in the text delta. `TextChunk` encodes a chunk once with a
marker in place of the text and keeps the JSON before and after it; a chunk is then those two around the
JSON of its text. The bytes are exactly `json_text(chunk)`: an object's JSON is its members' in order, and
a string member's JSON is the string's own (one encoder escapes both). A chunk with anything more (logprobs,
token ids, usage, an ending) is built and encoded whole, as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

# The one JSON encoding of the gateway's stream events: compact, non-ASCII as is (as vLLM and SGLang send).
json_text = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode

# Stands for the text while a template is made; its JSON ("\u0000...") is not what any other field encodes to.
_MARK = "\x00turnout:chunk-text\x00"
_MARK_JSON = json_text(_MARK)


class TextChunk:
    """The JSON of `build(text)` for any text, `build` being a chunk whose other fields are fixed."""

    def __init__(self, build: Callable[[str], dict[str, Any]]) -> None:
        self._build = build
        parts = json_text(build(_MARK)).split(_MARK_JSON)
        # Two parts unless another field held the marker too: then every chunk is encoded whole.
        self._around = (parts[0], parts[1]) if len(parts) == 2 else None

    def encode(self, text: str) -> str:
        if self._around is None:
            return json_text(self._build(text))
        before, after = self._around
        return before + json_text(text) + after
