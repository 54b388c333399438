"""The tool-call parsers for the peers' other formats, on outputs in each model's real format,
fed whole, in every 2 or 3 pieces, char by char and in random cuts; and the peers' parser names."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.tokenizer.tool_parsers import TOOL_PARSERS, tool_parser_class
from tests.tokenizer.splits import cut, splits
from tests.tokenizer.test_tool_parsers import Calls, parse

DS_CALLS_BEGIN = "<\uff5ctool\u2581calls\u2581begin\uff5c>"
DS_CALLS_END = "<\uff5ctool\u2581calls\u2581end\uff5c>"
DS_CALL_BEGIN = "<\uff5ctool\u2581call\u2581begin\uff5c>"
DS_CALL_END = "<\uff5ctool\u2581call\u2581end\uff5c>"
DS_SEP = "<\uff5ctool\u2581sep\uff5c>"


def ds_call(name: str, arguments: str) -> str:
    return f"{DS_CALL_BEGIN}function{DS_SEP}{name}\n```json\n{arguments}\n```{DS_CALL_END}"


def kimi_call(call_id: str, arguments: str) -> str:
    return f"<|tool_call_begin|>{call_id}<|tool_call_argument_begin|>{arguments}<|tool_call_end|>"


QWEN3_CODER_CALL = (
    "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n</parameter>\n"
    "<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n</function>\n</tool_call>"
)

CASES: list[tuple[str, str, str, Calls]] = [
    # (parser, output, content, [(name, arguments)])
    (
        "pythonic",
        '[get_weather(city="San Francisco", metric="celsius")]',
        "",
        [("get_weather", '{"city": "San Francisco", "metric": "celsius"}')],
    ),
    (
        "pythonic",
        '[register_user(name="John Doe", age=37, address={"city": "San Francisco", "state": "CA"}, role=None, '
        'passed_test=True, aliases=["John", "Johnny"])]',
        "",
        [
            (
                "register_user",
                '{"name": "John Doe", "age": 37, "address": {"city": "San Francisco", "state": "CA"}, '
                '"role": null, "passed_test": true, "aliases": ["John", "Johnny"]}',
            )
        ],
    ),
    (
        "pythonic",
        ' [get_weather(city="LA"), get_time(zone=\'PST\', note="a ] b", q="""x"y]""")]\nDone.',
        "Done.",
        [("get_weather", '{"city": "LA"}'), ("get_time", '{"zone": "PST", "note": "a ] b", "q": "x\\"y]"}')],
    ),
    ("pythonic", "[do_nothing()]", "", [("do_nothing", "{}")]),
    ("pythonic", "Sure: [get_weather(city='Paris')]", "Sure: [get_weather(city='Paris')]", []),  # not at the start
    ("pythonic", "[1, 2, 3] are numbers", "[1, 2, 3] are numbers", []),
    ("pythonic", "[get_weather('Paris')]", "[get_weather('Paris')]", []),  # positional arguments
    ("pythonic", '[get_weather(city="Par', '[get_weather(city="Par', []),  # cut off
    (
        "llama4_pythonic",
        '<|python_start|>[get_weather(city="Paris", unit="c")]<|python_end|>',
        "",
        [("get_weather", '{"city": "Paris", "unit": "c"}')],
    ),
    ("llama4_pythonic", "<|python_start|>[not a call]<|python_end|>", "<|python_start|>[not a call]<|python_end|>", []),
    (
        "granite",
        '<|tool_call|>[{"name": "get_current_weather", '
        '"arguments": {"city": "Dallas", "state": "TX", "unit": "fahrenheit"}}]',
        "",
        [("get_current_weather", '{"city": "Dallas", "state": "TX", "unit": "fahrenheit"}')],
    ),
    (
        "granite",
        '<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": [1]}}]',
        "",
        [("a", "{}"), ("b", '{"x": [1]}')],
    ),
    ("granite", ' [{"name": "f", "arguments": {"a": 1}}]', "", [("f", '{"a": 1}')]),
    ("granite", "The weather in Dallas is sunny.", "The weather in Dallas is sunny.", []),
    ("granite", "<|tool_call|>not json", "<|tool_call|>not json", []),
    (
        "internlm",
        'Let me check.<|action_start|><|plugin|>\n{"name": "get_current_weather", "parameters": '
        '{"location": "San Francisco, CA", "unit": "fahrenheit"}}<|action_end|>',
        "Let me check.",
        [("get_current_weather", '{"location": "San Francisco, CA", "unit": "fahrenheit"}')],
    ),
    (
        "interns1",
        '<|action_start|> <|plugin|>\n{"name": "get_weather", "parameters": {"location": "Tokyo"}}<|action_end|>',
        "",
        [("get_weather", '{"location": "Tokyo"}')],
    ),
    (
        "internlm",
        '<|action_start|><|plugin|>\n{"name": "f", "parame',
        '<|action_start|><|plugin|>\n{"name": "f", "parame',
        [],
    ),
    (
        "jamba",
        '<tool_calls>[\n    {"name": "get_current_weather", "arguments": {"city": "Dallas", "state": "TX", '
        '"unit": "fahrenheit"}}\n]</tool_calls>',
        "",
        [("get_current_weather", '{"city": "Dallas", "state": "TX", "unit": "fahrenheit"}')],
    ),
    (
        "jamba",
        'Sure. <tool_calls>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]</tool_calls>',
        "Sure. ",
        [("a", '{"x": 1}'), ("b", "{}")],
    ),
    ("jamba", '<tool_calls>[{"name": 1}]</tool_calls> ok', '<tool_calls>[{"name": 1}]</tool_calls> ok', []),
    (
        "phi4_mini_json",
        'functools[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        "",
        [("get_weather", '{"city": "Paris"}')],
    ),
    (
        "phi4_mini_json",
        'functools[{"name": "a", "arguments": {}}, {"name": "b", "parameters": {"x": 1}}]',
        "",
        [("a", "{}"), ("b", '{"x": 1}')],
    ),
    ("phi4_mini_json", "Use functools.partial here.", "Use functools.partial here.", []),
    # A tag that opened no calls leaves the text after it to be read again: the later call is found
    # however the chunks fall (the text is given back only up to where the form broke).
    (
        "phi4_mini_json",
        'import functools; functools[{"name": "f", "arguments": {}}]',
        "import functools; ",
        [("f", "{}")],
    ),
    (
        "qwen3_coder",
        QWEN3_CODER_CALL,
        "",
        [("get_current_weather", '{"city": "Dallas", "state": "TX", "unit": "fahrenheit"}')],
    ),
    (
        "qwen3_xml",
        "I'll check both.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=note>\nline one\nline two\n</parameter>\n"
        "</function>\n</tool_call>\n"
        "<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
        "I'll check both.\n",
        [("get_weather", '{"city": "Paris", "days": 3, "note": "line one\\nline two"}'), ("get_time", "{}")],
    ),
    (
        "qwen3_coder",
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        [],
    ),  # JSON is not this model's form
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\n1", "", [("f", '{"a": 1}')]),  # cut off: still a call
    (
        "deepseek_v3",
        DS_CALLS_BEGIN + ds_call("get_weather", '{"city": "Tokyo"}') + DS_CALLS_END,
        "",
        [("get_weather", '{"city": "Tokyo"}')],
    ),
    (
        "deepseekv3",
        "Let me look.\n"
        + DS_CALLS_BEGIN
        + ds_call("get_weather", '{"city": "Tokyo"}')
        + "\n"
        + ds_call("get_time", '{"tz": "JST"}')
        + DS_CALLS_END,
        "Let me look.\n",
        [("get_weather", '{"city": "Tokyo"}'), ("get_time", '{"tz": "JST"}')],
    ),
    (
        "deepseek_v3",
        DS_CALLS_BEGIN + ds_call("f", "not json") + DS_CALLS_END,
        DS_CALLS_BEGIN + ds_call("f", "not json") + DS_CALLS_END,
        [],
    ),
    ("deepseek_v3", "no calls here", "no calls here", []),
    (
        "deepseek_v31",
        "Checking.\n"
        + DS_CALLS_BEGIN
        + DS_CALL_BEGIN
        + "get_weather"
        + DS_SEP
        + '{"city": "Hangzhou"}'
        + DS_CALL_END
        + DS_CALL_BEGIN
        + "get_time"
        + DS_SEP
        + "{}"
        + DS_CALL_END
        + DS_CALLS_END,
        "Checking.\n",
        [("get_weather", '{"city": "Hangzhou"}'), ("get_time", "{}")],
    ),
    (
        "deepseekv31",
        DS_CALLS_BEGIN + DS_CALL_BEGIN + "f" + DS_SEP + "[1]" + DS_CALL_END + DS_CALLS_END,
        DS_CALLS_BEGIN + DS_CALL_BEGIN + "f" + DS_SEP + "[1]" + DS_CALL_END + DS_CALLS_END,
        [],
    ),
    (
        "glm45",
        "I will check.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n"
        "<arg_key>date</arg_key>\n<arg_value>2024-06-27</arg_value>\n</tool_call>"
        "<tool_call>get_time\n<arg_key>utc</arg_key>\n<arg_value>true</arg_value>\n</tool_call>",
        "I will check.\n",
        [("get_weather", '{"city": "Beijing", "date": "2024-06-27"}'), ("get_time", '{"utc": true}')],
    ),
    ("glm", "<tool_call>list_files\n</tool_call>", "", [("list_files", "{}")]),
    (
        "glm45",
        '<tool_call>{"name": "f"}</tool_call>',
        '<tool_call>{"name": "f"}</tool_call>',
        [],
    ),
    (
        "deepseek_v3",
        DS_CALLS_BEGIN + "oops " + DS_CALLS_BEGIN + ds_call("f", "{}") + DS_CALLS_END,
        DS_CALLS_BEGIN + "oops ",
        [("f", "{}")],
    ),
]

KIMI = (
    "<|tool_calls_section_begin|>"
    + kimi_call("functions.get_weather:0", '{"city": "Beijing"}')
    + kimi_call("functions.get_time:1", "{}")
    + "<|tool_calls_section_end|>"
)
CASES.append(
    ("kimi_k2", "Let me see. " + KIMI, "Let me see. ", [("get_weather", '{"city": "Beijing"}'), ("get_time", "{}")])
)
CASES.append(
    (
        "kimi_k2",
        "<|tool_calls_section_begin|><|tool_call_begin|>oops",
        "<|tool_calls_section_begin|><|tool_call_begin|>oops",
        [],
    )
)


def parse_checked(name: str, pieces: list[str]) -> tuple[str, Calls]:
    content, calls, ids = parse(TOOL_PARSERS[name], pieces)
    assert len(set(ids)) == len(ids)
    if name == "kimi_k2":  # the model's own ids
        assert all(i.startswith("functions.") for i in ids)
    else:
        assert all(i.startswith("call_") for i in ids)
    return content, calls


@pytest.mark.parametrize(("name", "text", "content", "calls"), CASES)
def test_model_outputs_whatever_the_pieces(name: str, text: str, content: str, calls: Calls) -> None:
    for pieces in splits(text):
        assert parse_checked(name, pieces) == (content, calls), pieces
    for call_name, arguments in calls:
        json.loads(arguments)  # every argument string is a JSON object
        assert call_name


@settings(max_examples=200, deadline=None)
@given(case=st.sampled_from(CASES), points=st.lists(st.integers(min_value=0, max_value=600), max_size=12))
def test_random_cuts_give_the_whole_text_result(case: tuple[str, str, str, Calls], points: list[int]) -> None:
    name, text, content, calls = case
    assert parse_checked(name, cut(text, points)) == (content, calls)


def test_kimi_k2_keeps_the_models_call_ids() -> None:
    _, _, ids = parse(TOOL_PARSERS["kimi_k2"], [KIMI])
    assert ids == ["functions.get_weather:0", "functions.get_time:1"]


@pytest.mark.parametrize(
    ("name", "head"),
    [
        ("deepseek_v3", DS_CALLS_BEGIN + ds_call("a", "{}") + "\n" + DS_CALL_BEGIN),
        ("kimi_k2", "<|tool_calls_section_begin|>" + kimi_call("functions.a:0", "{}") + "<|tool_call_beg"),
        ("phi4_mini_json", 'functools[{"name": "a", "arguments": {}}, {"na'),
    ],
)
def test_a_call_is_reported_before_the_section_ends(name: str, head: str) -> None:
    out = TOOL_PARSERS[name]().feed(head)
    assert [(c.index, c.name, c.arguments) for c in out.calls] == [(0, "a", "{}")] and out.content == ""


# Every tool-call-parser name of vLLM and SGLang that names a format we read.
VLLM_NAMES = [
    "deepseek_v3",
    "deepseek_v31",
    "glm45",
    "granite",
    "hermes",
    "internlm",
    "jamba",
    "kimi_k2",
    "llama3_json",
    "llama4_json",
    "llama4_pythonic",
    "mistral",
    "phi4_mini_json",
    "pythonic",
    "qwen3_coder",
    "qwen3_xml",
]
SGLANG_NAMES = [
    "deepseekv3",
    "deepseekv31",
    "glm",
    "glm45",
    "hermes",
    "interns1",
    "kimi_k2",
    "llama3",
    "mistral",
    "pythonic",
    "qwen",
    "qwen25",
    "qwen3_coder",
    "step3p5",
]


@pytest.mark.parametrize("name", VLLM_NAMES + SGLANG_NAMES)
def test_peer_names_resolve(name: str) -> None:
    assert tool_parser_class(name) is TOOL_PARSERS[name]


def test_spellings_of_one_format_are_one_parser() -> None:
    for one, other in [
        ("deepseek_v3", "deepseekv3"),
        ("deepseek_v31", "deepseekv31"),
        ("glm45", "glm"),
        ("internlm", "interns1"),
        ("qwen3_coder", "qwen3_xml"),
        ("qwen3_coder", "step3p5"),
        ("llama3_json", "llama3"),
        ("llama3_json", "llama4_json"),
        ("pythonic", "llama4_pythonic"),
    ]:
        assert TOOL_PARSERS[one] is TOOL_PARSERS[other]
