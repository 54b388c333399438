"""Every registered parser, on any text built from its formats' pieces (tags, fragments of calls,
brackets, quotes, prose), gives the same content, reasoning and calls however the text is cut:
the streaming answer never depends on where the chunks end."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from services.tokenizer.reasoning import REASONING_PARSERS
from services.tokenizer.tool_parsers import TOOL_PARSERS
from tests.tokenizer.splits import cut
from tests.tokenizer.test_reasoning_parsers import parse as parse_reasoning
from tests.tokenizer.test_tool_parsers import parse as parse_tools

DS = ["<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581calls\u2581end\uff5c>"]
DS += [
    "<\uff5ctool\u2581call\u2581begin\uff5c>",
    "<\uff5ctool\u2581call\u2581end\uff5c>",
    "<\uff5ctool\u2581sep\uff5c>",
]
PIECES = [
    *DS,
    *["function", "\n```json\n", "\n```", '{"name": "f", "arguments": {}}', '{"name": "g", "parameters": {"a": 1}}'],
    *["[", "]", ",", ";", " ", "\n", "x", "{", "}", '"', "'", "f(a=1)", "g()", "functools", "functions.f:0"],
    *["<tool_call>", "</tool_call>", "<tool_calls>", "</tool_calls>", "[TOOL_CALLS]", "<|python_tag|>"],
    *["<|python_start|>", "<|python_end|>", "<|tool_call|>", "<|action_start|>", "<|plugin|>", "<|action_end|>"],
    *[
        "<function=f>",
        "</function>",
        "<parameter=a>",
        "</parameter>",
        "<arg_key>a</arg_key>",
        "<arg_value>1</arg_value>",
    ],
    *["<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>"],
    *["<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>", "<thi", "◁think▷", "◁/think▷"],
    *["Here is my thought process:", "Here is my response:", "Here's my response:", "Here"],
]
texts = st.lists(st.sampled_from(PIECES), max_size=14).map("".join)
cuts = st.lists(st.integers(min_value=0, max_value=500), max_size=8)


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(sorted(TOOL_PARSERS)), text=texts, points=cuts)
def test_tool_calls_do_not_depend_on_the_cuts(name: str, text: str, points: list[int]) -> None:
    whole = parse_tools(TOOL_PARSERS[name], [text])
    pieces = parse_tools(TOOL_PARSERS[name], cut(text, points))
    assert pieces[:2] == whole[:2]  # content and calls (ids are fresh per run)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(REASONING_PARSERS)), text=texts, points=cuts, opened=st.booleans())
def test_reasoning_does_not_depend_on_the_cuts(name: str, text: str, points: list[int], opened: bool) -> None:
    whole = parse_reasoning(name, [text], thinking_open=opened)
    assert parse_reasoning(name, cut(text, points), thinking_open=opened) == whole
