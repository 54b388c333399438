"""Phi-4-mini JSON tool calls: `functools[{"name": ..., "arguments": {...}}, ...]`.

As vLLM's phi4_mini_json parser reads them. Each call is reported as soon as its
object is complete; text before `functools` is content (vLLM drops it; we keep
it, as for the other tag-started formats), and a `functools` not followed by a
list of calls is plain text.
"""

from __future__ import annotations

from services.tokenizer.tool_parsers.regions import CallArrayReader, RegionReader
from services.tokenizer.tool_parsers.tagged import TagStartedParser


class Phi4MiniJsonParser(TagStartedParser):
    start_tag = "functools"

    def _reader_at(self, start: int) -> RegionReader:
        return CallArrayReader(start, prefix=self.start_tag)
