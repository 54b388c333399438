"""Reasoning and tool-call parsing through a real Detokenize stream, with the default model's token ids;
thinking_open from Encode; tool calls and tool messages through chat templates."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.struct_pb2 import Struct
from grpc import aio

from services.tokenizer.service import TokenizerServicer
from services.tokenizer.text_tokenizer import TextTokenizer
from turnout.errors import StatusInterceptor
from turnout.grpc_server import client_channel
from turnout.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc

Mode = common_pb2.ToolCalling.Mode
THOUGHT = "<think>\nLet me add.\n</think>\n\nIt is 4."
# Tokens of THOUGHT: "<", "think", ">", "\n", "Let", " me", " add", ".", "\n", "</", "think", ">", ...
TOKENS_THROUGH_CLOSE = 12

# A small Hermes/Qwen2.5-style template: tools in the system turn, calls as <tool_call> JSON, tool results.
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}<|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response name={{ m.name }} id={{ m.tool_call_id }}>"
    "{{ m.content }}</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in m.tool_calls | default([]) %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{%- endfor %}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% if think %}<think>\n{% endif %}{%- endif %}"
)


@pytest.fixture(scope="module")
def text_tokenizer(default_model_dir: Path) -> TextTokenizer:
    return TextTokenizer(default_model_dir)


async def serve(servicer: TokenizerServicer) -> AsyncIterator[tokenizer_pb2_grpc.TokenizerStub]:
    server = aio.server(interceptors=[StatusInterceptor()])
    tokenizer_pb2_grpc.add_TokenizerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with client_channel(f"127.0.0.1:{port}") as channel:
        yield tokenizer_pb2_grpc.TokenizerStub(channel)
    await server.stop(0)
    await servicer.close()


@pytest.fixture
async def stub(text_tokenizer: TextTokenizer) -> AsyncIterator[tokenizer_pb2_grpc.TokenizerStub]:
    async for s in serve(TokenizerServicer(text_tokenizer, reasoning_parser="qwen3", tool_call_parser="hermes")):
        yield s


@pytest.fixture
async def bare_stub(text_tokenizer: TextTokenizer) -> AsyncIterator[tokenizer_pb2_grpc.TokenizerStub]:
    async for s in serve(TokenizerServicer(text_tokenizer)):
        yield s


async def detokenize(
    stub: tokenizer_pb2_grpc.TokenizerStub, start: tokenizer_pb2.DetokenizeStart, ids: list[int], per_chunk: int = 1
) -> list[tokenizer_pb2.DetokenizeResponse]:
    call = stub.Detokenize()
    await call.write(tokenizer_pb2.DetokenizeRequest(start=start))
    assert await call.read() == tokenizer_pb2.DetokenizeResponse()  # the start is accepted with an empty answer
    responses = []
    chunks = [ids[i : i + per_chunk] for i in range(0, len(ids), per_chunk)]
    for index, chunk in enumerate(chunks):
        tokens = tokenizer_pb2.DetokenizeTokens(token_ids=chunk, last=index == len(chunks) - 1)
        await call.write(tokenizer_pb2.DetokenizeRequest(tokens=tokens))
        response = await call.read()
        assert response is not aio.EOF
        responses.append(response)
        if response.HasField("matched_stop"):
            break
    await call.done_writing()
    return responses


def joined(responses: list[tokenizer_pb2.DetokenizeResponse]) -> tuple[str, str]:
    return "".join(r.reasoning_text for r in responses), "".join(r.text for r in responses)


@pytest.mark.parametrize("per_chunk", [1, 3, 100])
async def test_separate_reasoning_splits_the_block_and_counts_its_tokens(
    stub: tokenizer_pb2_grpc.TokenizerStub, text_tokenizer: TextTokenizer, per_chunk: int
) -> None:
    ids = text_tokenizer.encode(THOUGHT, add_special_tokens=False)
    responses = await detokenize(stub, tokenizer_pb2.DetokenizeStart(separate_reasoning=True), ids, per_chunk)
    assert joined(responses) == ("Let me add.", "It is 4.")
    counts = [r.reasoning_tokens for r in responses]
    assert counts == sorted(counts) and counts[-1] == TOKENS_THROUGH_CLOSE  # cumulative


async def test_reasoning_is_left_in_the_text_unless_asked_or_configured(
    stub: tokenizer_pb2_grpc.TokenizerStub, bare_stub: tokenizer_pb2_grpc.TokenizerStub, text_tokenizer: TextTokenizer
) -> None:
    ids = text_tokenizer.encode(THOUGHT, add_special_tokens=False)
    for server, start in [
        (stub, tokenizer_pb2.DetokenizeStart()),
        (bare_stub, tokenizer_pb2.DetokenizeStart(separate_reasoning=True)),
    ]:
        responses = await detokenize(server, start, ids)
        assert joined(responses) == ("", THOUGHT)
        assert responses[-1].reasoning_tokens == 0


async def test_thinking_open_starts_inside_and_stop_strings_apply_first(
    stub: tokenizer_pb2_grpc.TokenizerStub, text_tokenizer: TextTokenizer
) -> None:
    ids = text_tokenizer.encode("Let me add.\n</think>\n\nIt is 4. Done", add_special_tokens=False)
    start = tokenizer_pb2.DetokenizeStart(separate_reasoning=True, thinking_open=True, stop=[" Done"])
    responses = await detokenize(stub, start, ids)
    assert joined(responses) == ("Let me add.", "It is 4.")
    assert responses[-1].matched_stop == " Done"
    # Without thinking_open, qwen3 sees no block: the close tag is just text.
    responses = await detokenize(stub, tokenizer_pb2.DetokenizeStart(separate_reasoning=True), ids)
    assert joined(responses) == ("", "Let me add.\n</think>\n\nIt is 4. Done")


async def test_auto_tool_calls_come_out_of_the_text(
    stub: tokenizer_pb2_grpc.TokenizerStub, text_tokenizer: TextTokenizer
) -> None:
    output = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ids = text_tokenizer.encode(output, add_special_tokens=False)
    start = tokenizer_pb2.DetokenizeStart(tool_calling=common_pb2.ToolCalling(mode=Mode.AUTO))
    responses = await detokenize(stub, start, ids)
    assert joined(responses)[1] == "Checking.\n"
    calls = [c for r in responses for c in r.tool_calls]
    assert len(calls) == 1 and calls[0].id.startswith("call_")
    assert (calls[0].index, calls[0].name, calls[0].arguments) == (0, "get_weather", '{"city": "Paris"}')
    # Mode NONE (or unset): the call stays text.
    plain = await detokenize(stub, tokenizer_pb2.DetokenizeStart(), ids)
    assert joined(plain)[1] == output and not any(r.tool_calls for r in plain)


async def test_named_and_required_read_the_constrained_json(
    bare_stub: tokenizer_pb2_grpc.TokenizerStub, text_tokenizer: TextTokenizer
) -> None:
    arguments = '{"city": "Paris"}'
    named = common_pb2.ToolCalling(mode=Mode.NAMED, function_name="get_weather")
    ids = text_tokenizer.encode(arguments, add_special_tokens=False)
    responses = await detokenize(bare_stub, tokenizer_pb2.DetokenizeStart(tool_calling=named), ids)
    calls = [c for r in responses for c in r.tool_calls]
    assert len(calls) > 1  # streamed in fragments
    assert calls[0].name == "get_weather" and all(not c.id for c in calls[1:])
    assert "".join(c.arguments for c in calls) == arguments and joined(responses)[1] == ""

    required = common_pb2.ToolCalling(mode=Mode.REQUIRED)
    output = '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}]'
    ids = text_tokenizer.encode(output, add_special_tokens=False)
    responses = await detokenize(bare_stub, tokenizer_pb2.DetokenizeStart(tool_calling=required), ids)
    calls = [c for r in responses for c in r.tool_calls]
    assert [(c.index, c.name, c.arguments) for c in calls] == [(0, "a", '{"x": 1}'), (1, "b", "{}")]


async def test_auto_without_a_tool_call_parser_is_refused_at_once(
    bare_stub: tokenizer_pb2_grpc.TokenizerStub,
) -> None:
    call = bare_stub.Detokenize()
    start = tokenizer_pb2.DetokenizeStart(tool_calling=common_pb2.ToolCalling(mode=Mode.AUTO))
    await call.write(tokenizer_pb2.DetokenizeRequest(start=start))
    with pytest.raises(aio.AioRpcError) as info:
        await asyncio.wait_for(call.read(), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "tool_choice 'auto' needs the server to run with --tool-call-parser"


def chat(*messages: common_pb2.ChatMessage, **options: object) -> tokenizer_pb2.EncodeRequest:
    return tokenizer_pb2.EncodeRequest(
        chat=common_pb2.ChatInput(messages=messages, options=common_pb2.ChatTemplateOptions(**options))  # type: ignore[arg-type]
    )


def kwargs(**values: object) -> Struct:
    struct = Struct()
    struct.update(values)
    return struct


async def test_encode_reports_a_thinking_block_the_template_left_open(
    stub: tokenizer_pb2_grpc.TokenizerStub, bare_stub: tokenizer_pb2_grpc.TokenizerStub
) -> None:
    user = common_pb2.ChatMessage(role="user", content="2+2?")
    for server in (stub, bare_stub):  # the parser's tags, or <think> and </think> without one
        opened = await server.Encode(chat(user, chat_template=HERMES_TEMPLATE, chat_template_kwargs=kwargs(think=True)))
        assert opened.prompt_text.endswith("<think>\n") and opened.thinking_open
        closed = await server.Encode(chat(user, chat_template=HERMES_TEMPLATE))
        assert not closed.thinking_open
    default = await stub.Encode(chat(user))
    assert not default.thinking_open
    text = await stub.Encode(tokenizer_pb2.EncodeRequest(text="<think>"))
    assert not text.thinking_open  # plain text is no rendered template


async def test_encode_reports_a_request_that_switched_thinking_off(
    stub: tokenizer_pb2_grpc.TokenizerStub, bare_stub: tokenizer_pb2_grpc.TokenizerStub, text_tokenizer: TextTokenizer
) -> None:
    user = common_pb2.ChatMessage(role="user", content="2+2?")
    off = await stub.Encode(chat(user, chat_template_kwargs=kwargs(enable_thinking=False)))
    assert off.thinking_off  # the qwen3 parser reads enable_thinking
    assert not (await stub.Encode(chat(user, chat_template_kwargs=kwargs(enable_thinking=True)))).thinking_off
    assert not (await stub.Encode(chat(user))).thinking_off
    # Without a reasoning parser there is nothing to switch off.
    assert not (await bare_stub.Encode(chat(user, chat_template_kwargs=kwargs(enable_thinking=False)))).thinking_off

    ids = text_tokenizer.encode(THOUGHT, add_special_tokens=False)
    start = tokenizer_pb2.DetokenizeStart(separate_reasoning=True, thinking_off=True)
    responses = await detokenize(stub, start, ids)
    assert joined(responses) == ("", THOUGHT) and responses[-1].reasoning_tokens == 0


def tool_conversation() -> list[common_pb2.ChatMessage]:
    return [
        common_pb2.ChatMessage(role="user", content="Weather in Paris?"),
        common_pb2.ChatMessage(
            role="assistant",
            content="",
            tool_calls=[
                common_pb2.ToolCall(id="call_1", type="function", name="get_weather", arguments='{"city": "Paris"}')
            ],
        ),
        common_pb2.ChatMessage(role="tool", content="18C, sunny", tool_call_id="call_1", name="get_weather"),
    ]


async def test_tool_calls_and_tool_messages_render_through_templates(stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
    tool = Struct()
    tool.update({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}})
    reply = await stub.Encode(chat(*tool_conversation(), chat_template=HERMES_TEMPLATE, tools=[tool]))
    prompt = reply.prompt_text
    tools_line = prompt.split("Tools:", 1)[1].split("<|im_end|>", 1)[0]
    assert json.loads(tools_line) == {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object"}},
    }
    # The arguments reach the template as a mapping, so `tojson` writes the object, not a quoted string.
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert "<tool_response name=get_weather id=call_1>18C, sunny</tool_response>" in prompt
    default = await stub.Encode(chat(*tool_conversation()))
    assert "<|im_start|>tool\n18C, sunny<|im_end|>" in default.prompt_text
