"""Reasoning parsers by name (tokenizer --reasoning-parser), under both vLLM's and SGLang's spellings."""

from __future__ import annotations

from services.tokenizer.reasoning.base import ReasoningDelta, ReasoningParser
from services.tokenizer.reasoning.think_tags import DeepSeekR1Parser, GenericThinkParser, Qwen3Parser
from services.tokenizer.reasoning.variants import (
    DeepSeekV3Parser,
    Glm45Parser,
    GraniteParser,
    KimiK2Parser,
    KimiParser,
    Qwen3ThinkingParser,
)

# Canonical names (SGLang's where it has the parser, else vLLM's) first; then the other spellings.
REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek-r1": DeepSeekR1Parser,
    "qwen3": Qwen3Parser,
    "think": GenericThinkParser,
    "deepseek-v3": DeepSeekV3Parser,
    "qwen3-thinking": Qwen3ThinkingParser,
    "glm45": Glm45Parser,
    "kimi": KimiParser,
    "kimi_k2": KimiK2Parser,
    "granite": GraniteParser,
}

# Other names the peers use for the same parsers: vLLM's snake_case spellings, SGLang's aliases.
REASONING_ALIASES: dict[str, str] = {
    "deepseek_r1": "deepseek-r1",  # vLLM
    "deepseek_v3": "deepseek-v3",  # vLLM
    # Models both peers read with a parser we have (SGLang maps these names to the same detectors).
    "step3": "deepseek-r1",  # StepFun Step3: everything before </think> (vLLM's step3 reads it so too)
    "minimax": "qwen3-thinking",  # MiniMax-M1/M2: always thinks (SGLang: Qwen3's detector, forced)
    "interns1": "qwen3",  # Intern-S1: Qwen3's tags and enable_thinking switch
}
REASONING_PARSERS.update({alias: REASONING_PARSERS[name] for alias, name in REASONING_ALIASES.items()})

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
    "REASONING_ALIASES",
    "REASONING_PARSERS",
    "ReasoningDelta",
    "ReasoningParser",
    "reasoning_parser_class",
]
