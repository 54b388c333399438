"""GLM-4.5 / 4.6 tool calls (glm45 in vLLM and SGLang, also SGLang's glm):

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Beijing</arg_value>
    </tool_call>

The function name is the first line of the body; each `<arg_key>` is followed by
its `<arg_value>`. As for qwen3_coder, the tokenizer does not see the tools'
schemas: a value that is valid JSON is read as JSON, any other as a string (as
vLLM and SGLang do for parameters whose schema type is not a string).
"""

from __future__ import annotations

import json
import re
from typing import Any

from services.tokenizer.tool_parsers.base import FoundCall
from services.tokenizer.tool_parsers.regions import RegionReader, TaggedCallReader
from services.tokenizer.tool_parsers.tagged import TagStartedParser

# A function name as OpenAI's API allows them (letters, digits, `_`, `-`), and dots.
_NAME = re.compile(r"[\w.-]+")
_ARGUMENT = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def glm_call(body: str) -> list[FoundCall] | None:
    name, _, rest = body.strip().partition("\n")
    name = name.strip()
    if not _NAME.fullmatch(name):
        return None
    arguments: dict[str, Any] = {}
    pos = 0
    for match in _ARGUMENT.finditer(rest):
        if rest[pos : match.start()].strip():
            return None
        arguments[match.group(1).strip()] = _value(match.group(2).strip())
        pos = match.end()
    if rest[pos:].strip():
        return None
    return [FoundCall(name, json.dumps(arguments, ensure_ascii=False))]


class Glm45ToolParser(TagStartedParser):
    start_tag = "<tool_call>"
    end_tag = "</tool_call>"

    def _reader_at(self, start: int) -> RegionReader:
        return TaggedCallReader(start, self.start_tag, self.end_tag, glm_call)
