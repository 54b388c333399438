"""Reasoning parsers: the same split of reasoning and answer however the text is cut into pieces."""

from __future__ import annotations

import pytest

from services.tokenizer.reasoning import REASONING_PARSERS, reasoning_parser_class
from services.tokenizer.reasoning.token_count import ReasoningTokenCounter
from tests.tokenizer.splits import splits


def parse(name: str, pieces: list[str], *, thinking_open: bool = False) -> tuple[str, str]:
    parser = REASONING_PARSERS[name](thinking_open=thinking_open)
    reasoning = content = ""
    for k, piece in enumerate(pieces):
        delta = parser.feed(piece, last=k == len(pieces) - 1)
        reasoning += delta.reasoning
        content += delta.content
    return reasoning, content


def parse_every_way(name: str, text: str, *, thinking_open: bool = False) -> tuple[str, str]:
    results = {parse(name, pieces, thinking_open=thinking_open) for pieces in splits(text)}
    assert len(results) == 1, f"{name}: pieces change the result: {results}"
    return results.pop()


CASES = [
    # (parser, text, thinking_open, reasoning, content)
    ("deepseek-r1", "<think>\nLet me see.\n</think>\n\nIt is 4.", False, "Let me see.", "It is 4."),
    ("deepseek-r1", "Let me see.</think>It is 4.", False, "Let me see.", "It is 4."),  # no start tag
    ("deepseek-r1", "Still thinking </thi", False, "Still thinking </thi", ""),  # truncated: all reasoning
    ("deepseek-r1", "a</think>b</think>c", False, "a", "b</think>c"),  # one block only
    ("qwen3", "<think>\nHmm.\n</think>\n\nHi!", False, "Hmm.", "Hi!"),
    ("qwen3", "  <think>x</think>y", False, "x", "y"),  # leading whitespace before the tag
    ("qwen3", "Plain answer.</think> no", False, "", "Plain answer.</think> no"),  # no explicit block
    ("qwen3", "Hi <think>x</think>y", False, "", "Hi <think>x</think>y"),  # only a block that opens the output
    ("qwen3", "\nreasoned</think>\n\nanswer", True, "reasoned", "answer"),  # the prompt opened it
    ("qwen3", "<think>dup</think>answer", True, "dup", "answer"),  # a repeated start tag is dropped
    ("qwen3", "<thin", False, "", "<thin"),  # a partial tag at the end is released
    ("qwen3", "  ", False, "", "  "),
    ("think", "Hi <think>x</think> there <think>y</think>z", False, "xy", "Hi there z"),
    ("think", "a <thinking> b", False, "", "a <thinking> b"),
]


@pytest.mark.parametrize(("name", "text", "thinking_open", "reasoning", "content"), CASES)
def test_reasoning_and_content_whatever_the_pieces(
    name: str, text: str, thinking_open: bool, reasoning: str, content: str
) -> None:
    assert parse_every_way(name, text, thinking_open=thinking_open) == (reasoning, content)


def test_partial_close_tag_is_held_then_released() -> None:
    parser = REASONING_PARSERS["qwen3"]()
    assert parser.feed("<think>abc </").reasoning == "abc"  # " </" may begin the close tag
    assert parser.inside
    delta = parser.feed("b> more")
    assert delta.reasoning == " </b> more"
    delta = parser.feed("</think>done", last=True)
    assert (delta.reasoning, delta.content) == ("", "done")
    assert not parser.inside and parser.blocks_closed == 1


def test_token_counter_counts_tokens_inside_the_block_through_the_close() -> None:
    # "<think>" in three tokens, two thinking tokens, "</think>" in two, then the answer.
    tokens = ["<", "think", ">", "a b", " c", "</", "think>", "\n\n", "Answer", "."]
    counter = ReasoningTokenCounter(REASONING_PARSERS["qwen3"]())
    for token in tokens:
        counter.add(token)
    assert counter.count == 7

    counter = ReasoningTokenCounter(REASONING_PARSERS["qwen3"]())
    for token in ["<", "b", ">", "x"]:  # looked like a tag, was not
        counter.add(token)
    assert counter.count == 0

    counter = ReasoningTokenCounter(REASONING_PARSERS["deepseek-r1"]())
    for token in ["x", "y", "</think>", "z"]:  # starts inside without a tag
        counter.add(token)
    assert counter.count == 3


def test_unknown_parser_name_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown reasoning parser 'nope'; choose one of deepseek-r1, qwen3, think"):
        reasoning_parser_class("nope")
