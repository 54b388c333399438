"""AI21 Jamba tool calls: `<tool_calls>[{"name": ..., "arguments": {...}}, ...]</tool_calls>`.

As vLLM's jamba parser reads them (the tags are special tokens: requests need
`skip_special_tokens: false`). The calls are reported when the closing tag (or
the end of the output) makes the array whole; text before the tag is content.
"""

from __future__ import annotations

from services.tokenizer.tool_parsers.regions import RegionReader, TaggedCallReader, call_array
from services.tokenizer.tool_parsers.tagged import TagStartedParser


class JambaParser(TagStartedParser):
    start_tag = "<tool_calls>"
    end_tag = "</tool_calls>"

    def _reader_at(self, start: int) -> RegionReader:
        return TaggedCallReader(start, self.start_tag, self.end_tag, call_array)
