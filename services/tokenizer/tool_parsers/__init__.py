"""Tool-call parsers by name (tokenizer --tool-call-parser), and the readers for constrained calls."""

from __future__ import annotations

from services.tokenizer.tool_parsers.base import ToolCallPiece, ToolParse, ToolParser
from services.tokenizer.tool_parsers.constrained import NamedCallParser, RequiredCallsParser
from services.tokenizer.tool_parsers.llama3_json import Llama3JsonParser
from services.tokenizer.tool_parsers.tagged import HermesParser, MistralParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    # Qwen2.5 writes the same <tool_call> JSON form as Hermes.
    "qwen": HermesParser,
    "qwen25": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
}


def tool_parser_class(name: str) -> type[ToolParser]:
    """The parser class registered as `name`; ValueError naming the choices otherwise."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {', '.join(TOOL_PARSERS)}") from None


__all__ = [
    "TOOL_PARSERS",
    "NamedCallParser",
    "RequiredCallsParser",
    "ToolCallPiece",
    "ToolParse",
    "ToolParser",
    "tool_parser_class",
]
