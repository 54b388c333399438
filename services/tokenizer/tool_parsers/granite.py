"""IBM Granite 3.x tool calls: `<|tool_call|>` (3.0; `<tool_call>` in 3.1) then a JSON list
`[{"name": ..., "arguments": {...}}, ...]`.

As vLLM's granite parser reads them, calls are recognized only when the answer
starts with the list (after whitespace and the optional tag); any other answer
is content. Each call is reported as soon as its object is complete.
"""

from __future__ import annotations

from services.tokenizer.tool_parsers.leading import LeadingCallsParser
from services.tokenizer.tool_parsers.regions import CallArrayReader, RegionReader


class GraniteToolParser(LeadingCallsParser):
    lead_tags = ("<|tool_call|>", "<tool_call>")
    opener = "["

    def _reader_at(self, start: int, prefix: str) -> RegionReader:
        return CallArrayReader(start, prefix=prefix)
