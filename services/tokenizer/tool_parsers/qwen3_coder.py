"""Qwen3-Coder XML tool calls (qwen3_coder; vLLM's qwen3_xml is the same form):

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

Each `<tool_call>` holds one or more `<function=NAME>` blocks; a parameter's
value is the text between its tags less one leading and one trailing newline.
The tokenizer does not see the tools' schemas, so a value is read as JSON when
it is valid JSON (numbers, booleans, null, objects, arrays) and kept as a string
otherwise, as SGLang reads it. A call whose end tags never came still counts at
the end of the output; anything else that breaks the form is released as text.
"""

from __future__ import annotations

import json
import re
from typing import Any

from services.tokenizer.tool_parsers.base import FoundCall
from services.tokenizer.tool_parsers.regions import RegionReader, TaggedCallReader
from services.tokenizer.tool_parsers.tagged import TagStartedParser

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.DOTALL)


def _value(text: str) -> Any:
    text = text.removeprefix("\n").removesuffix("\n")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _arguments(body: str) -> dict[str, Any] | None:
    values: dict[str, Any] = {}
    pos = 0
    for match in _PARAMETER.finditer(body):
        if body[pos : match.start()].strip():
            return None
        values[match.group(1).strip()] = _value(match.group(2))
        pos = match.end()
    return None if body[pos:].strip() else values


def xml_calls(body: str) -> list[FoundCall] | None:
    """The `<function=...>` blocks of one `<tool_call>`; None if there are none or other text is there."""
    calls: list[FoundCall] = []
    pos = 0
    for match in _FUNCTION.finditer(body):
        arguments = _arguments(match.group(2))
        name = match.group(1).strip()
        if body[pos : match.start()].strip() or arguments is None or not name:
            return None
        calls.append(FoundCall(name, json.dumps(arguments, ensure_ascii=False)))
        pos = match.end()
    return calls if calls and not body[pos:].strip() else None


class Qwen3CoderParser(TagStartedParser):
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    def _reader_at(self, start: int) -> RegionReader:
        return TaggedCallReader(start, self.start_tag, self.end_tag, xml_calls)
