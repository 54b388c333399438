"""Kimi-K2 tool calls (kimi_k2 in vLLM and SGLang):

    <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>
    {"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>

The call id is the model's own `functions.NAME:INDEX` (Kimi's template matches
tool results to it, so it is passed on as the call's id, as vLLM and SGLang do);
the name is NAME. The tags are special tokens: requests need
`skip_special_tokens: false`. Each call is reported when its `<|tool_call_end|>`
arrives.
"""

from __future__ import annotations

import re

from services.tokenizer.tool_parsers.base import FoundCall
from services.tokenizer.tool_parsers.json_text import NotJson, object_members
from services.tokenizer.tool_parsers.regions import RegionReader
from services.tokenizer.tool_parsers.sections import SectionReader
from services.tokenizer.tool_parsers.tagged import TagStartedParser

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
CALL_END = "<|tool_call_end|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
# `functions.get_weather:0`: an optional namespace, the name, the call's index.
_CALL_ID = re.compile(r"(?:[\w-]+\.)?([\w.-]+?):\d+")


def kimi_call(body: str) -> FoundCall | None:
    call_id, sep, arguments = body.partition(ARGUMENT_BEGIN)
    call_id, arguments = call_id.strip(), arguments.strip()
    match = _CALL_ID.fullmatch(call_id)
    if not sep or match is None:
        return None
    try:
        object_members(arguments)
    except NotJson:
        return None
    return FoundCall(match.group(1), arguments, call_id)


class KimiK2ToolParser(TagStartedParser):
    start_tag = SECTION_BEGIN

    def _reader_at(self, start: int) -> RegionReader:
        return SectionReader(
            start,
            section_tag=SECTION_BEGIN,
            section_end=SECTION_END,
            call_begin=CALL_BEGIN,
            call_end=CALL_END,
            parse_one=kimi_call,
        )
