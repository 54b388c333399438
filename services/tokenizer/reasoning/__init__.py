"""Reasoning parsers by name (tokenizer --reasoning-parser)."""

from __future__ import annotations

from services.tokenizer.reasoning.base import ReasoningDelta, ReasoningParser
from services.tokenizer.reasoning.think_tags import DeepSeekR1Parser, GenericThinkParser, Qwen3Parser

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek-r1": DeepSeekR1Parser,
    "qwen3": Qwen3Parser,
    "think": GenericThinkParser,
}

# The tags EncodeResponse.thinking_open looks for when no parser is configured.
DEFAULT_THINK_TAGS = ("<think>", "</think>")


def reasoning_parser_class(name: str) -> type[ReasoningParser]:
    """The parser class registered as `name`; ValueError naming the choices otherwise."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSERS)}") from None


__all__ = [
    "DEFAULT_THINK_TAGS",
    "REASONING_PARSERS",
    "ReasoningDelta",
    "ReasoningParser",
    "reasoning_parser_class",
]
