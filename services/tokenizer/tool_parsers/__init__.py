"""Tool-call parsers by name (tokenizer --tool-call-parser), under both vLLM's and SGLang's spellings,
and the readers for constrained calls."""

from __future__ import annotations

from services.tokenizer.tool_parsers.base import ToolCallPiece, ToolParse, ToolParser
from services.tokenizer.tool_parsers.constrained import NamedCallParser, RequiredCallsParser
from services.tokenizer.tool_parsers.deepseek_v3 import DeepSeekV3ToolParser, DeepSeekV31ToolParser
from services.tokenizer.tool_parsers.glm45 import Glm45ToolParser
from services.tokenizer.tool_parsers.granite import GraniteToolParser
from services.tokenizer.tool_parsers.internlm import InternLMParser
from services.tokenizer.tool_parsers.jamba import JambaParser
from services.tokenizer.tool_parsers.kimi_k2 import KimiK2ToolParser
from services.tokenizer.tool_parsers.llama3_json import Llama3JsonParser
from services.tokenizer.tool_parsers.phi4_mini import Phi4MiniJsonParser
from services.tokenizer.tool_parsers.pythonic import PythonicParser
from services.tokenizer.tool_parsers.qwen3_coder import Qwen3CoderParser
from services.tokenizer.tool_parsers.tagged import HermesParser, MistralParser

# One name per format first (vLLM's where it has the parser); then the other spellings.
TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    # Qwen2.5 writes the same <tool_call> JSON form as Hermes.
    "qwen": HermesParser,
    "qwen25": HermesParser,
    "llama3_json": Llama3JsonParser,
    "mistral": MistralParser,
    "pythonic": PythonicParser,
    "granite": GraniteToolParser,
    "internlm": InternLMParser,
    "jamba": JambaParser,
    "phi4_mini_json": Phi4MiniJsonParser,
    "qwen3_coder": Qwen3CoderParser,
    "deepseek_v3": DeepSeekV3ToolParser,
    "deepseek_v31": DeepSeekV31ToolParser,
    "kimi_k2": KimiK2ToolParser,
    "glm45": Glm45ToolParser,
}

# Other names the peers give the same formats.
TOOL_ALIASES: dict[str, str] = {
    "llama3": "llama3_json",  # SGLang
    "llama4_json": "llama3_json",  # vLLM: Llama 4 writes Llama 3's JSON form
    "llama4_pythonic": "pythonic",  # vLLM: the list, optionally in <|python_start|> … <|python_end|>
    "interns1": "internlm",  # SGLang
    "qwen3_xml": "qwen3_coder",  # vLLM
    "step3p5": "qwen3_coder",  # SGLang: Step-3.5 writes Qwen3-Coder's XML form
    "deepseekv3": "deepseek_v3",  # SGLang
    "deepseekv31": "deepseek_v31",  # SGLang
    "glm": "glm45",  # SGLang
}
TOOL_PARSERS.update({alias: TOOL_PARSERS[name] for alias, name in TOOL_ALIASES.items()})


def tool_parser_class(name: str) -> type[ToolParser]:
    """The parser class registered as `name`; ValueError naming the choices otherwise."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {', '.join(TOOL_PARSERS)}") from None


__all__ = [
    "TOOL_ALIASES",
    "TOOL_PARSERS",
    "NamedCallParser",
    "RequiredCallsParser",
    "ToolCallPiece",
    "ToolParse",
    "ToolParser",
    "tool_parser_class",
]
