"""A stream chunk encoded from its template is byte for byte the chunk encoded whole."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.chunk_json import TextChunk, json_text

TEXTS = [
    "",
    " hello",
    'a "quoted" \\ backslash / slash',
    "line\nbreak\ttab\r\x08\x0c",
    "\x00\x01\x1f control",
    "é 中文 😀 \u2028\u2029",
    "\ud800 lone surrogate",
    "\x00turnout:chunk-text\x00",  # the marker itself, as a text
]


def _chunk(text: str, model: str = "org/model") -> dict[str, Any]:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}],
    }


@pytest.mark.parametrize("text", TEXTS)
def test_a_templated_chunk_is_the_whole_encoding(text: str) -> None:
    assert TextChunk(_chunk).encode(text) == json_text(_chunk(text))


def test_a_chunk_whose_other_fields_hold_the_marker_is_encoded_whole() -> None:
    def build(text: str) -> dict[str, Any]:
        return _chunk(text, model="\x00turnout:chunk-text\x00")

    chunk = TextChunk(build)
    for text in TEXTS:
        assert chunk.encode(text) == json_text(build(text))
