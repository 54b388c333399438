"""DeepSeek-V3 / R1-0528 tool calls (vLLM deepseek_v3, SGLang deepseekv3):

    <|tool▁calls▁begin|><|tool▁call▁begin|>function<|tool▁sep|>get_weather
    ```json
    {"city": "Paris"}
    ```<|tool▁call▁end|><|tool▁calls▁end|>

(written here with `|`: the model's bars are U+FF5C FULLWIDTH VERTICAL LINE, and
`▁` is U+2581). Text before the section is content; each call is reported when
its `<|tool▁call▁end|>` arrives.

DeepSeek-V3.1 (vLLM deepseek_v31, SGLang deepseekv31) drops the type and the fence:
`<|tool▁call▁begin|>get_weather<|tool▁sep|>{"city": "Paris"}<|tool▁call▁end|>`.
"""

from __future__ import annotations

import re

from services.tokenizer.tool_parsers.base import FoundCall
from services.tokenizer.tool_parsers.json_text import NotJson, object_members
from services.tokenizer.tool_parsers.regions import RegionReader
from services.tokenizer.tool_parsers.sections import SectionReader
from services.tokenizer.tool_parsers.tagged import TagStartedParser

CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
SEP = "<\uff5ctool\u2581sep\uff5c>"
_BODY = re.compile(r"\s*function" + re.escape(SEP) + r"([^\n]+)\n```(?:json)?\n(.*)\n```\s*", re.DOTALL)


def deepseek_call(body: str) -> FoundCall | None:
    match = _BODY.fullmatch(body)
    if match is None:
        return None
    name, arguments = match.group(1).strip(), match.group(2).strip()
    try:
        object_members(arguments)
    except NotJson:
        return None
    return FoundCall(name, arguments) if name else None


def deepseek_v31_call(body: str) -> FoundCall | None:
    name, sep, arguments = body.partition(SEP)
    name, arguments = name.strip(), arguments.strip()
    if not sep or not name or "\n" in name:
        return None
    try:
        object_members(arguments)
    except NotJson:
        return None
    return FoundCall(name, arguments)


class DeepSeekV3ToolParser(TagStartedParser):
    start_tag = CALLS_BEGIN
    parse_one = staticmethod(deepseek_call)

    def _reader_at(self, start: int) -> RegionReader:
        return SectionReader(
            start,
            section_tag=CALLS_BEGIN,
            section_end=CALLS_END,
            call_begin=CALL_BEGIN,
            call_end=CALL_END,
            parse_one=self.parse_one,
        )


class DeepSeekV31ToolParser(DeepSeekV3ToolParser):
    parse_one = staticmethod(deepseek_v31_call)
