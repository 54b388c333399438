"""SGLang's cumulative `/generate` stream events, encoded at the cost of what each event adds.

Every streamed event repeats the sample's whole `text` and `output_ids` so far (SGLang's format), so
encoding each event with `json.dumps` costs O(length) and a stream O(length²): at 128 tokens an event
took ~20 µs of JSON, most of it re-encoding what the previous event had already encoded. Both grow only
at their end, so their JSON is kept per sample and extended by the new part. The bytes are exactly
`json.dumps(event, ensure_ascii=False, separators=(",", ":"))`: JSON escapes a string character by
character, so the JSON of `a + b` is that of `a` followed by that of `b` (inside the quotes), and a
list of integers is its items joined by commas. Should a sample's text or ids ever not extend the ones
before, they are encoded whole again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.chunk_json import json_text as _dumps


@dataclass
class _Encoded:
    """A sample's text and token ids as last encoded, and their JSON (without the quotes or brackets)."""

    text: str = ""
    text_json: str = ""
    ids: list[int] = field(default_factory=list)
    ids_count: int = 0
    ids_json: str = ""


class CumulativeEvents:
    """Encodes one stream's events, whose `text` and `output_ids` grow per sample (`key`)."""

    def __init__(self) -> None:
        self._samples: dict[Any, _Encoded] = {}

    def encode(self, key: Any, text: str, ids: list[int], rest: dict[str, Any]) -> str:
        """The JSON of `{"text": text, "output_ids": ids, **rest}`. `ids` is the sample's own list, which
        only grows (it is not copied: what was encoded of it is remembered by its length)."""
        done = self._samples.get(key)
        if done is None:
            done = self._samples[key] = _Encoded()
        if text is not done.text:
            if text.startswith(done.text):
                done.text_json += _dumps(text[len(done.text) :])[1:-1]
            else:
                done.text_json = _dumps(text)[1:-1]
            done.text = text
        if ids is not done.ids or len(ids) < done.ids_count:
            done.ids, done.ids_count, done.ids_json = ids, 0, ""
        if len(ids) > done.ids_count:
            new = ",".join(map(str, ids[done.ids_count :]))
            done.ids_json = f"{done.ids_json},{new}" if done.ids_count else new
            done.ids_count = len(ids)
        tail = "".join(f",{_dumps(name)}:{_dumps(value)}" for name, value in rest.items())
        return f'{{"text":"{done.text_json}","output_ids":[{done.ids_json}]{tail}}}'
