"""Tool-call parsers: the same content and calls however the text is cut into pieces; bad calls stay text."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from services.tokenizer.tool_parsers import (
    TOOL_PARSERS,
    NamedCallParser,
    RequiredCallsParser,
    ToolParser,
    tool_parser_class,
)
from tests.tokenizer.splits import splits

Calls = list[tuple[str, str]]


def parse(make: Callable[[], ToolParser], pieces: list[str]) -> tuple[str, Calls, list[str]]:
    """(content, [(name, arguments)] by index, ids) from feeding the pieces in order."""
    parser = make()
    content = ""
    calls: dict[int, list[str]] = {}
    ids: list[str] = []
    for k, piece in enumerate(pieces):
        out = parser.feed(piece, last=k == len(pieces) - 1)
        content += out.content
        for call in out.calls:
            if call.id:  # a call's first piece: id and name, once
                assert call.index not in calls and call.index == len(calls)
                assert call.name
                calls[call.index] = [call.name, ""]
                ids.append(call.id)
            else:
                assert not call.name and call.index in calls
            calls[call.index][1] += call.arguments
    return content, [(name, arguments) for name, arguments in calls.values()], ids


def parse_every_way(make: Callable[[], ToolParser], text: str) -> tuple[str, Calls]:
    results: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for pieces in splits(text):
        content, calls, ids = parse(make, pieces)
        assert len(set(ids)) == len(ids) and all(i.startswith("call_") for i in ids)
        results.add((content, tuple(calls)))
    assert len(results) == 1, f"pieces change the result: {results}"
    content, found = results.pop()
    return content, list(found)


HERMES = [
    (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "Let me check.\n",
        [("get_weather", '{"city": "Paris"}')],
    ),
    (  # several in a row; whitespace between them is dropped; "</x>" inside a string is not a tag
        '<tool_call>{"name": "a", "arguments": {"t": "</x>"}}</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": {}}</tool_call>\n',
        "",
        [("a", '{"t": "</x>"}'), ("b", "{}")],
    ),
    (  # malformed JSON is released as text, and the text after it too
        'Hi <tool_call>{"name": "f", "arguments": {"a": 1}</tool_call> after',
        'Hi <tool_call>{"name": "f", "arguments": {"a": 1}</tool_call> after',
        [],
    ),
    ('<tool_call>{"name": "f", "arguments": {"a": 1}}', "", [("f", '{"a": 1}')]),  # end tag never came
    ('<tool_call>{"name": "f", "arguments": {"a"', '<tool_call>{"name": "f", "arguments": {"a"', []),  # cut off
    ('<tool_call>{"name": "f", "arguments": "{\\"a\\": 2}"}</tool_call>', "", [("f", '{"a": 2}')]),  # quoted
    ('<tool_call>{"name": "unknown_fn"}</tool_call>', "", [("unknown_fn", "{}")]),
    ('<tool_call>{"arguments": {}}</tool_call>x', '<tool_call>{"arguments": {}}</tool_call>x', []),  # no name
    ("a < b <tool", "a < b <tool", []),
]


@pytest.mark.parametrize(("text", "content", "calls"), HERMES)
@pytest.mark.parametrize("name", ["hermes", "qwen", "qwen25"])
def test_hermes_and_qwen(name: str, text: str, content: str, calls: Calls) -> None:
    assert parse_every_way(TOOL_PARSERS[name], text) == (content, calls)


LLAMA3 = [
    (
        '<|python_tag|>{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {"b": [1, "}"]}}',
        "",
        [("f", '{"a": 1}'), ("g", '{"b": [1, "}"]}')],
    ),
    (' {"name": "f", "parameters": {"x": null}}', "", [("f", '{"x": null}')]),
    ('{"name": "f", "parameters": {"a": 1}}; oops', "; oops", [("f", '{"a": 1}')]),
    ('{"answer": 42}', '{"answer": 42}', []),  # JSON that is not a call
    ('Hello {"name": "f"}', 'Hello {"name": "f"}', []),  # calls only open the answer
    ('{"name": "f", "parameters": {', '{"name": "f", "parameters": {', []),
]


@pytest.mark.parametrize(("text", "content", "calls"), LLAMA3)
def test_llama3_json(text: str, content: str, calls: Calls) -> None:
    assert parse_every_way(TOOL_PARSERS["llama3_json"], text) == (content, calls)


MISTRAL = [
    (
        'Sure. [TOOL_CALLS] [{"name": "f", "arguments": {"a": "]"}}, {"name": "g", "arguments": {}}]',
        "Sure. ",
        [("f", '{"a": "]"}'), ("g", "{}")],
    ),
    ('[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"nam', ', {"nam', [("f", '{"a": 1}')]),
    ("[TOOL_CALLS] not json", "[TOOL_CALLS] not json", []),
    ('[TOOL_CALLS] oops [TOOL_CALLS][{"name": "f", "arguments": {}}]', "[TOOL_CALLS] oops ", [("f", "{}")]),
    ('[TOOL_CALLS]{"name": "f", "arguments": {}}', "", [("f", "{}")]),  # one object without the list
]


@pytest.mark.parametrize(("text", "content", "calls"), MISTRAL)
def test_mistral(text: str, content: str, calls: Calls) -> None:
    assert parse_every_way(TOOL_PARSERS["mistral"], text) == (content, calls)


def test_required_reads_the_constrained_array_call_by_call() -> None:
    text = '[{"name": "f", "parameters": {"a": 1}}, {"name": "g", "parameters": {}}]'
    assert parse_every_way(RequiredCallsParser, text) == ("", [("f", '{"a": 1}'), ("g", "{}")])
    parser = RequiredCallsParser()
    first = parser.feed('[{"name": "f", "parameters": {"a": 1}}, {"na')
    assert [(c.index, c.name, c.arguments) for c in first.calls] == [(0, "f", '{"a": 1}')]  # before the array ends
    assert parse_every_way(RequiredCallsParser, '[{"name": "f"') == ('[{"name": "f"', [])  # cut off: text


def test_named_streams_the_arguments_as_they_come() -> None:
    text = '{"city": "Paris", "days": [1, 2]}'
    assert parse_every_way(lambda: NamedCallParser("get_weather"), text) == ("", [("get_weather", text)])
    parser = NamedCallParser("get_weather")
    first, second = parser.feed('{"ci'), parser.feed('ty": 1}')
    assert first.calls[0].name == "get_weather" and first.calls[0].arguments == '{"ci'
    assert (second.calls[0].id, second.calls[0].arguments) == ("", 'ty": 1}')
    json.loads(first.calls[0].arguments + second.calls[0].arguments)


def test_ids_are_unique_across_calls_and_parsers() -> None:
    ids = [parse(TOOL_PARSERS["hermes"], ['<tool_call>{"name": "f"}</tool_call>' * 3])[2] for _ in range(20)]
    flat = [i for run in ids for i in run]
    assert len(flat) == 60 and len(set(flat)) == 60


def test_unknown_parser_name_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="unknown tool-call parser 'x'; choose one of hermes, qwen"):
        tool_parser_class("x")
