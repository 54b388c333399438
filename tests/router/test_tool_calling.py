"""Reasoning and tool calls through the router: a real tokenizer servicer (the default model's
vocabulary) behind the in-process router, fake engines streaming scripted token ids."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.struct_pb2 import Struct
from grpc import aio

from services.tokenizer.service import TokenizerServicer
from services.tokenizer.text_tokenizer import TextTokenizer
from tests.router.conftest import Cluster, finish_of, text_of
from turnout.v1 import common_pb2, inference_pb2

Mode = common_pb2.ToolCalling.Mode
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
OPEN_THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n<think>\n"
)


@pytest.fixture(scope="module")
def text_tokenizer(default_model_dir: Path) -> TextTokenizer:
    return TextTokenizer(default_model_dir)


@pytest.fixture
async def cluster(make_cluster: Callable[..., Any], text_tokenizer: TextTokenizer) -> Cluster:
    servicer = TokenizerServicer(text_tokenizer, reasoning_parser="qwen3", tool_call_parser="hermes")
    cluster: Cluster = await make_cluster(1, tokenizer_servicer=servicer)
    return cluster


def tool(name: str, parameters: dict[str, Any] | None = None) -> Struct:
    function: dict[str, Any] = {"name": name}
    if parameters is not None:
        function["parameters"] = parameters
    struct = Struct()
    struct.update({"type": "function", "function": function})
    return struct


def chat_request(
    tools: list[Struct] | None = None, template: str | None = None, **fields: Any
) -> inference_pb2.GenerateRequest:
    options = common_pb2.ChatTemplateOptions(tools=tools or [])
    if template is not None:
        options.chat_template = template
    chat = common_pb2.ChatInput(messages=[common_pb2.ChatMessage(role="user", content="hi")], options=options)
    return inference_pb2.GenerateRequest(chat=chat, **fields)


def script(cluster: Cluster, text_tokenizer: TextTokenizer, *outputs: str) -> None:
    cluster.engines[0].outputs = [text_tokenizer.encode(o, add_special_tokens=False) for o in outputs]


def chunks(responses: list[inference_pb2.GenerateResponse], index: int = 0) -> list[inference_pb2.GenerateChunk]:
    return [r.chunk for r in responses if r.WhichOneof("kind") == "chunk" and r.chunk.index == index]


def calls_of(responses: list[inference_pb2.GenerateResponse], index: int = 0) -> list[tuple[str, str]]:
    """(name, arguments) per call, fragments joined; every call has an id."""
    calls: dict[int, list[str]] = {}
    for chunk in chunks(responses, index):
        for delta in chunk.tool_calls:
            if delta.id:
                calls[delta.index] = [delta.name, ""]
            calls[delta.index][1] += delta.arguments
    return [(name, arguments) for name, arguments in calls.values()]


async def generate(cluster: Cluster, request: inference_pb2.GenerateRequest) -> list[inference_pb2.GenerateResponse]:
    return [r async for r in cluster.inference.Generate(request)]


async def test_reasoning_text_and_tokens_reach_the_chunks_and_usage(
    cluster: Cluster, text_tokenizer: TextTokenizer
) -> None:
    script(cluster, text_tokenizer, "<think>\nLet me add.\n</think>\n\nIt is 4.")
    responses = await generate(cluster, chat_request(separate_reasoning=True))
    assert "".join(c.reasoning_text for c in chunks(responses)) == "Let me add."
    assert text_of(responses) == "It is 4."
    assert chunks(responses)[-1].reasoning_tokens == 12  # through the token that completes "</think>"
    complete = [r.complete for r in responses if r.WhichOneof("kind") == "complete"]
    assert complete[0].usage.reasoning_tokens == 12 and complete[0].usage.completion_tokens == 19

    plain = await generate(cluster, chat_request())  # not asked: the text is left whole
    assert text_of(plain) == "<think>\nLet me add.\n</think>\n\nIt is 4."
    assert not any(c.reasoning_text for c in chunks(plain))


async def test_a_template_that_opens_the_thinking_block_is_followed(
    cluster: Cluster, text_tokenizer: TextTokenizer
) -> None:
    script(cluster, text_tokenizer, "Let me add.\n</think>\n\nIt is 4. The end")
    request = chat_request(template=OPEN_THINK_TEMPLATE, separate_reasoning=True)
    request.sampling_params.stop.append(" The end")  # stop strings still see the whole output
    responses = await generate(cluster, request)
    assert "".join(c.reasoning_text for c in chunks(responses)) == "Let me add."
    assert text_of(responses) == "It is 4."
    assert finish_of(responses)[0].stop.stop_str == " The end"


async def test_enable_thinking_false_switches_the_qwen3_parser_off(
    cluster: Cluster, text_tokenizer: TextTokenizer
) -> None:
    output = "<think>\nLet me add.\n</think>\n\nIt is 4."
    request = chat_request(separate_reasoning=True)
    request.chat.options.chat_template_kwargs.update({"enable_thinking": False})
    script(cluster, text_tokenizer, output)
    responses = await generate(cluster, request)
    assert text_of(responses) == output  # as vLLM and SGLang: that request's output is all answer
    assert not any(c.reasoning_text for c in chunks(responses)) and chunks(responses)[-1].reasoning_tokens == 0

    request.chat.options.chat_template_kwargs.update({"enable_thinking": True})
    script(cluster, text_tokenizer, output)
    responses = await generate(cluster, request)
    assert "".join(c.reasoning_text for c in chunks(responses)) == "Let me add." and text_of(responses) == "It is 4."


async def test_auto_tool_calls_per_sample(cluster: Cluster, text_tokenizer: TextTokenizer) -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    script(cluster, text_tokenizer, "Checking.\n" + call, "No tools needed.")
    request = chat_request([tool("get_weather", WEATHER)], tool_calling=common_pb2.ToolCalling(mode=Mode.AUTO))
    request.sampling_params.n = 2
    responses = await generate(cluster, request)
    assert calls_of(responses, 0) == [("get_weather", '{"city": "Paris"}')]
    assert "".join(c.text for c in chunks(responses, 0)) == "Checking.\n"
    assert calls_of(responses, 1) == []
    assert "".join(c.text for c in chunks(responses, 1)) == "No tools needed."


async def test_named_tool_constrains_the_engine_to_its_parameters(
    cluster: Cluster, text_tokenizer: TextTokenizer
) -> None:
    script(cluster, text_tokenizer, '{"city": "Paris"}')
    named = common_pb2.ToolCalling(mode=Mode.NAMED, function_name="get_weather")
    responses = await generate(cluster, chat_request([tool("other"), tool("get_weather", WEATHER)], tool_calling=named))
    assert json.loads(cluster.engines[0].received[-1].sampling_params.json_schema) == WEATHER
    assert calls_of(responses) == [("get_weather", '{"city": "Paris"}')]
    assert text_of(responses) == ""

    await generate(cluster, chat_request([tool("get_weather")], tool_calling=named))
    assert json.loads(cluster.engines[0].received[-1].sampling_params.json_schema) == {"type": "object"}


@pytest.mark.parametrize("parallel", [None, True, False])
async def test_required_constrains_the_engine_to_an_array_of_calls(
    cluster: Cluster, text_tokenizer: TextTokenizer, parallel: bool | None
) -> None:
    script(cluster, text_tokenizer, '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]')
    calling = common_pb2.ToolCalling(mode=Mode.REQUIRED)
    if parallel is not None:
        calling.parallel = parallel
    responses = await generate(
        cluster, chat_request([tool("get_weather", WEATHER), tool("noop")], tool_calling=calling)
    )
    item = {
        "type": "object",
        "properties": {"name": {"const": "get_weather"}, "parameters": WEATHER},
        "required": ["name", "parameters"],
    }
    noop = {**item, "properties": {"name": {"const": "noop"}, "parameters": {"type": "object"}}}
    expected: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": [item, noop]}}
    if parallel is False:
        expected["maxItems"] = 1
    assert json.loads(cluster.engines[0].received[-1].sampling_params.json_schema) == expected
    assert calls_of(responses) == [("get_weather", '{"city": "Oslo"}')]


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (chat_request(tool_calling=common_pb2.ToolCalling(mode=Mode.AUTO)), "tool_calling mode AUTO needs tools"),
        (
            inference_pb2.GenerateRequest(text="hi", tool_calling=common_pb2.ToolCalling(mode=Mode.REQUIRED)),
            "tool_calling mode REQUIRED needs tools",
        ),
        (
            chat_request([tool("f")], tool_calling=common_pb2.ToolCalling(mode=Mode.NAMED, function_name="nope")),
            "Tool 'nope' not found in tools",
        ),
        (
            chat_request(
                [tool("f")],
                tool_calling=common_pb2.ToolCalling(mode=Mode.REQUIRED),
                sampling_params=common_pb2.SamplingParams(regex="a+"),
            ),
            "tool_calling mode REQUIRED constrains the output to tool calls; it cannot be combined with regex",
        ),
        (
            chat_request([tool("")], tool_calling=common_pb2.ToolCalling(mode=Mode.AUTO)),
            "tools[0].function.name must be a non-empty string",
        ),
    ],
)
async def test_bad_tool_requests_are_invalid_argument(
    cluster: Cluster, request_: inference_pb2.GenerateRequest, message: str
) -> None:
    with pytest.raises(aio.AioRpcError) as info:
        await generate(cluster, request_)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (info.value.details() or "")
    assert cluster.engines[0].received == []


async def test_auto_is_refused_before_the_engine_runs_without_a_tool_call_parser(
    make_cluster: Callable[..., Any], text_tokenizer: TextTokenizer
) -> None:
    cluster: Cluster = await make_cluster(1, tokenizer_servicer=TokenizerServicer(text_tokenizer))
    cluster.engines[0].hold = asyncio.Event()  # never set: its stream ends only when the router cancels it
    request = chat_request([tool("f")], tool_calling=common_pb2.ToolCalling(mode=Mode.AUTO))
    with pytest.raises(aio.AioRpcError) as info:
        await generate(cluster, request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "tool_choice 'auto' needs the server to run with --tool-call-parser"
    engine = cluster.engines[0]  # asked while the tokenizer checked the start, then cancelled
    deadline = asyncio.get_running_loop().time() + 60
    while engine.cancelled < len(engine.received) and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)
    assert engine.cancelled == len(engine.received)


async def test_a_call_completed_only_by_the_end_of_the_output_still_arrives(
    cluster: Cluster, text_tokenizer: TextTokenizer
) -> None:
    # No end tag: the call is known to be whole only when the engine's Complete comes (no new tokens then).
    script(cluster, text_tokenizer, '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}')
    request = chat_request([tool("get_weather", WEATHER)], tool_calling=common_pb2.ToolCalling(mode=Mode.AUTO))
    responses = await generate(cluster, request)
    assert calls_of(responses) == [("get_weather", '{"city": "Rome"}')]
    assert text_of(responses) == ""
