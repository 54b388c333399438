"""The per-model reasoning parsers on outputs in each model's real format, and the peers' parser names.

Each text is fed whole, in every 2 or 3 pieces, char by char, and in random cuts:
the split into reasoning and answer never depends on where the pieces end.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.tokenizer.reasoning import REASONING_PARSERS, reasoning_parser_class
from services.tokenizer.reasoning.token_count import ReasoningTokenCounter
from tests.tokenizer.splits import cut
from tests.tokenizer.test_reasoning_parsers import parse, parse_every_way

CASES = [
    # (parser, output, thinking_open, reasoning, content)
    # DeepSeek-V3.1 in thinking mode: the template ends the prompt with <think>.
    (
        "deepseek-v3",
        "The user asks for 2+2. That is 4.</think>2 + 2 = 4.",
        True,
        "The user asks for 2+2. That is 4.",
        "2 + 2 = 4.",
    ),
    ("deepseek_v3", "Short.\n</think>\n\nDone", False, "Short.", "Done"),
    # Qwen3-235B-A22B-Thinking-2507: the template opens the block; the output has only the close tag.
    (
        "qwen3-thinking",
        "Okay, the user wants a haiku.\n</think>\n\nSoft rain on the roof",
        False,
        "Okay, the user wants a haiku.",
        "Soft rain on the roof",
    ),
    ("qwen3-thinking", "<think>\nHmm.\n</think>\n\nHi", False, "Hmm.", "Hi"),
    ("qwen3-thinking", "Still thinking about it", False, "Still thinking about it", ""),  # cut off
    # GLM-4.5 writes its own <think>; a <tool_call> without </think> ends the thinking.
    (
        "glm45",
        "<think>The user wants the weather.</think>\nIt is sunny.",
        False,
        "The user wants the weather.",
        "It is sunny.",
    ),
    (
        "glm45",
        "<think>I should call the tool.\n<tool_call>get_weather\n<arg_key>city</arg_key>",
        False,
        "I should call the tool.",
        "<tool_call>get_weather\n<arg_key>city</arg_key>",
    ),
    ("glm45", "<think>x</think>a <tool_call> b", False, "x", "a <tool_call> b"),  # after the block: plain answer
    # Kimi-VL-Thinking: ◁think▷ … ◁/think▷.
    (
        "kimi",
        "◁think▷Let me count the apples: 3 + 2 = 5.◁/think▷There are 5 apples.",
        False,
        "Let me count the apples: 3 + 2 = 5.",
        "There are 5 apples.",
    ),
    ("kimi", "No thinking here.", False, "", "No thinking here."),
    ("kimi", "◁thin", False, "", "◁thin"),
    # Kimi-K2-Thinking: <think> blocks; the tool-call section ends the thinking.
    ("kimi_k2", "<think>Need the weather.</think>Let me check.", False, "Need the weather.", "Let me check."),
    (
        "kimi_k2",
        "<think>Need the weather.<|tool_calls_section_begin|><|tool_call_begin|>",
        False,
        "Need the weather.",
        "<|tool_calls_section_begin|><|tool_call_begin|>",
    ),
    # IBM Granite 3.2 with thinking on: plain-text markers.
    (
        "granite",
        "Here is my thought process:\nThe user greets me.\n\nHere is my response:\nHello! How can I help?",
        False,
        "The user greets me.",
        "Hello! How can I help?",
    ),
    (
        "granite",
        "Here's my thought process:This is a reasoning sectionHere's my response:This is the rest",
        False,
        "This is a reasoning section",
        "This is the rest",
    ),
    ("granite", "Here is my thought process:\nstill going", False, "still going", ""),
    ("granite", "Just an answer. Here is my response: no", False, "", "Just an answer. Here is my response: no"),
    ("granite", "Here is my", False, "", "Here is my"),
]


@pytest.mark.parametrize(("name", "text", "thinking_open", "reasoning", "content"), CASES)
def test_model_outputs_whatever_the_pieces(
    name: str, text: str, thinking_open: bool, reasoning: str, content: str
) -> None:
    assert parse_every_way(name, text, thinking_open=thinking_open) == (reasoning, content)


@settings(max_examples=200, deadline=None)
@given(case=st.sampled_from(CASES), points=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_random_cuts_give_the_whole_text_result(case: tuple[str, str, bool, str, str], points: list[int]) -> None:
    name, text, thinking_open, reasoning, content = case
    assert parse(name, cut(text, points), thinking_open=thinking_open) == (reasoning, content)


def test_thinking_switches_read_from_chat_template_kwargs() -> None:
    cls = reasoning_parser_class
    # Qwen3 and GLM-4.5 think unless enable_thinking is false.
    for name in ("qwen3", "glm45"):
        assert cls(name).thinks({}) and cls(name).thinks({"enable_thinking": True})
        assert not cls(name).thinks({"enable_thinking": False})
    # DeepSeek-V3.1 thinks only when asked (SGLang reads `thinking`, vLLM also `enable_thinking`).
    assert not cls("deepseek-v3").thinks({})
    assert cls("deepseek-v3").thinks({"thinking": True}) and cls("deepseek_v3").thinks({"enable_thinking": True})
    # Kimi-K2 thinks unless `thinking` is false.
    assert cls("kimi_k2").thinks({}) and not cls("kimi_k2").thinks({"thinking": False})
    # Models without a switch always parse.
    for name in ("deepseek-r1", "qwen3-thinking", "think", "kimi", "granite"):
        assert cls(name).thinks({"enable_thinking": False, "thinking": False})


def test_token_counter_with_an_implicit_end() -> None:
    counter = ReasoningTokenCounter(REASONING_PARSERS["glm45"]())
    for token in ["<think>", "a", " b", "<tool_call>", "f", "</tool_call>"]:
        counter.add(token)
    assert counter.count == 4  # <think>, a, b, and the token that ended the block


# Every reasoning-parser name of vLLM and SGLang that names a parser we have.
VLLM_NAMES = ["deepseek_r1", "deepseek_v3", "glm45", "granite", "kimi_k2", "qwen3", "step3"]
SGLANG_NAMES = [
    *["deepseek-r1", "deepseek-v3", "glm45", "interns1", "kimi", "kimi_k2", "minimax", "qwen3", "qwen3-thinking"],
    "step3",
]


@pytest.mark.parametrize("name", VLLM_NAMES + SGLANG_NAMES)
def test_peer_names_resolve(name: str) -> None:
    assert reasoning_parser_class(name) is REASONING_PARSERS[name]


def test_spellings_of_one_model_are_one_parser() -> None:
    assert REASONING_PARSERS["deepseek_r1"] is REASONING_PARSERS["deepseek-r1"]
    assert REASONING_PARSERS["deepseek_v3"] is REASONING_PARSERS["deepseek-v3"]
    assert REASONING_PARSERS["step3"] is REASONING_PARSERS["deepseek-r1"]
    assert REASONING_PARSERS["minimax"] is REASONING_PARSERS["qwen3-thinking"]
    assert REASONING_PARSERS["interns1"] is REASONING_PARSERS["qwen3"]
