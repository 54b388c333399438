"""InternLM2 / 2.5 and Intern-S1 tool calls: `<|action_start|><|plugin|>` then one JSON object
`{"name": ..., "parameters": {...}}`, then `<|action_end|>`.

As vLLM's internlm and SGLang's interns1 parsers read them: the tags are special
tokens (requests need `skip_special_tokens: false`), and decoding with
spaces_between_special_tokens writes `<|action_start|> <|plugin|>`, so any
whitespace between the two tags is accepted. Text before a call is content; a
body that is not a call is released as text.
"""

from __future__ import annotations

from services.tokenizer.tool_parsers.base import FoundCall
from services.tokenizer.tool_parsers.regions import RegionReader, TaggedCallReader, one_json_call
from services.tokenizer.tool_parsers.tagged import TagStartedParser

PLUGIN = "<|plugin|>"


def plugin_call(body: str) -> list[FoundCall] | None:
    rest = body.lstrip()
    return one_json_call(rest[len(PLUGIN) :]) if rest.startswith(PLUGIN) else None


class InternLMParser(TagStartedParser):
    start_tag = "<|action_start|>"
    end_tag = "<|action_end|>"

    def _reader_at(self, start: int) -> RegionReader:
        return TaggedCallReader(start, self.start_tag, self.end_tag, plugin_call)
