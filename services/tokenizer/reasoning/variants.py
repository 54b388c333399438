"""The think-tag parser per model family: its tags, whether the output starts inside the block,
what ends the block implicitly, and the chat_template_kwargs switch that turns thinking off.

As the peers read each model (SGLang's reasoning_parser.py detectors, vLLM's reasoning/ parsers):

    deepseek-v3     DeepSeek-V3.1/3.2 think only when asked (`thinking` or `enable_thinking`
                    true); then as deepseek-r1: the output starts inside `<think>`
    qwen3-thinking  Qwen3 *-Thinking-2507: always thinks; the template opened the block
    glm45           GLM-4.5/4.6: thinks unless `enable_thinking` is false, starts inside the
                    block; a `<tool_call>` ends the thinking (the call stays in the answer)
    kimi            Kimi-VL thinking: `◁think▷` … `◁/think▷` opening the output
    kimi_k2         Kimi-K2-Thinking: `<think>` blocks, thinks unless `thinking` is false; the
                    tool-call section ends the thinking
    granite         IBM Granite 3.x: plain-text markers "Here is my thought process:" and
                    "Here is my response:" ("Here's" too: quantized models write it)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.tokenizer.reasoning.think_tags import DeepSeekR1Parser, ThinkTagParser


class DeepSeekV3Parser(DeepSeekR1Parser):
    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return bool(template_kwargs.get("thinking")) or bool(template_kwargs.get("enable_thinking"))


class Qwen3ThinkingParser(ThinkTagParser):
    starts_inside = True


class Glm45Parser(ThinkTagParser):
    starts_inside = True
    implicit_ends = ("<tool_call>",)

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return bool(template_kwargs.get("enable_thinking", True))


class KimiParser(ThinkTagParser):
    start_tag = "◁think▷"
    end_tag = "◁/think▷"
    start_tags = (start_tag,)
    end_tags = (end_tag,)


class KimiK2Parser(ThinkTagParser):
    starts_inside = True
    implicit_ends = ("<|tool_calls_section_begin|>",)

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        return template_kwargs.get("thinking") is not False


class GraniteParser(ThinkTagParser):
    start_tag = "Here is my thought process:"
    end_tag = "Here is my response:"
    start_tags = (start_tag, "Here's my thought process:")
    end_tags = (end_tag, "Here's my response:")
