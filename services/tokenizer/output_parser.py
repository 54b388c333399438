"""The parsing one Detokenize stream does after stop strings: reasoning out, then tool calls out.

    final text (stop strings matched) -> reasoning parser -> answer text -> tool-call parser -> text + calls

Each stage is on only when asked for: reasoning when the stream sets
`separate_reasoning`, the server has a reasoning parser and the request did not
switch thinking off (`thinking_off`, from its chat_template_kwargs); tool calls by
`tool_calling.mode` (AUTO: the server's tool-call parser, refused when it has
none; REQUIRED / NAMED: the JSON form the router constrained the engine to).
Reasoning tokens are counted on each token's own text, not on the final text,
which stop-string hold-back shifts against the tokens (see reasoning.token_count).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.tokenizer.reasoning import ReasoningParser
from services.tokenizer.reasoning.token_count import ReasoningTokenCounter
from services.tokenizer.tool_parsers import (
    NamedCallParser,
    RequiredCallsParser,
    ToolCallPiece,
    ToolParser,
)
from turnout.errors import InvalidArgument
from turnout.v1 import common_pb2, tokenizer_pb2

Mode = common_pb2.ToolCalling.Mode
AUTO_NEEDS_PARSER = "tool_choice 'auto' needs the server to run with --tool-call-parser"


@dataclass(slots=True)
class ParsedOutput:
    reasoning: str = ""
    content: str = ""
    calls: list[ToolCallPiece] = field(default_factory=list)


class OutputParser:
    def __init__(
        self,
        start: tokenizer_pb2.DetokenizeStart,
        reasoning_parser: type[ReasoningParser] | None,
        tool_parser: type[ToolParser] | None,
    ) -> None:
        """InvalidArgument for a stream that asks for what this server cannot do."""
        self._reasoning: ReasoningParser | None = None
        self._counter: ReasoningTokenCounter | None = None
        if start.separate_reasoning and reasoning_parser is not None and not start.thinking_off:
            self._reasoning = reasoning_parser(thinking_open=start.thinking_open)
            self._counter = ReasoningTokenCounter(reasoning_parser(thinking_open=start.thinking_open))
        self._tools = _tool_parser(start.tool_calling, tool_parser)

    @property
    def counts_tokens(self) -> bool:
        return self._counter is not None

    @property
    def reasoning_tokens(self) -> int:
        return 0 if self._counter is None else self._counter.count

    def count(self, text: str, tokens: int) -> None:
        """The text of the next `tokens` output tokens, as the detokenizer gave it (before stop strings)."""
        if self._counter is not None:
            self._counter.add(text, tokens)

    def parse(self, text: str, *, last: bool) -> ParsedOutput:
        out = ParsedOutput(content=text)
        if self._reasoning is not None:
            delta = self._reasoning.feed(text, last=last)
            out.reasoning, out.content = delta.reasoning, delta.content
        if self._tools is not None:
            tools = self._tools.feed(out.content, last=last)
            out.content, out.calls = tools.content, tools.calls
        return out


def _tool_parser(calling: common_pb2.ToolCalling, configured: type[ToolParser] | None) -> ToolParser | None:
    if calling.mode == Mode.AUTO:
        if configured is None:
            raise InvalidArgument(AUTO_NEEDS_PARSER)
        return configured()
    if calling.mode == Mode.REQUIRED:
        return RequiredCallsParser()
    if calling.mode == Mode.NAMED:
        if not calling.function_name:
            raise InvalidArgument("tool_calling mode NAMED needs function_name")
        return NamedCallParser(calling.function_name)
    return None
