"""The Tokenizer over real gRPC under hostile input: slow, looping, failing or huge chat templates,
huge prompts and huge id lists end with INVALID_ARGUMENT naming the limit, and never hold up the
requests of others."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc import aio

from services.tokenizer.config import TokenizerLimits
from services.tokenizer.service import TokenizerServicer
from services.tokenizer.text_tokenizer import TextTokenizer
from turnout.errors import StatusInterceptor
from turnout.grpc_server import CHANNEL_OPTIONS, client_channel
from turnout.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc

# Two nested range(15000) loops: ~37 s of rendering before the sandbox (the template).
NESTED_LOOPS = "{% for i in range(15000) %}{% for j in range(15000) %}{% endfor %}{% endfor %}"
TIMEOUT_S = 1.5
# Generous for a busy 2-core machine, far below the attack: an answer this late was held up by it.
PROMPT_ANSWER_S = 1.0
# A refusal of a 10 MB message: most of it is sending the message; encoding it would take 20-30 s.
BIG_REFUSAL_S = 5.0


@pytest.fixture(scope="module")
def text_tokenizer(default_model_dir: Path) -> TextTokenizer:
    return TextTokenizer(default_model_dir)


@pytest.fixture
async def servicer(text_tokenizer: TextTokenizer) -> AsyncIterator[TokenizerServicer]:
    limits = TokenizerLimits(
        chat_template_timeout=TIMEOUT_S, max_prompt_bytes=4 << 20, max_token_ids=1000, max_encode_texts=8
    )
    servicer = TokenizerServicer(text_tokenizer, limits=limits)
    await servicer.start()
    yield servicer
    await servicer.close()


@pytest.fixture
async def stub(servicer: TokenizerServicer) -> AsyncIterator[tokenizer_pb2_grpc.TokenizerStub]:
    server = aio.server(interceptors=[StatusInterceptor()], options=CHANNEL_OPTIONS)
    tokenizer_pb2_grpc.add_TokenizerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with client_channel(f"127.0.0.1:{port}") as channel:
        yield tokenizer_pb2_grpc.TokenizerStub(channel)
    await server.stop(0)


def chat(template: str | None = None, kwargs: dict[str, Any] | None = None) -> tokenizer_pb2.EncodeRequest:
    options = common_pb2.ChatTemplateOptions(chat_template=template)
    if kwargs is not None:
        options.chat_template_kwargs.update(kwargs)
    message = common_pb2.ChatMessage(role="user", content="Hello there")
    return tokenizer_pb2.EncodeRequest(chat=common_pb2.ChatInput(messages=[message], options=options))


async def refusal(call: Any) -> str:
    """The message of the INVALID_ARGUMENT the call ends with."""
    with pytest.raises(aio.AioRpcError) as info:
        await call
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    return info.value.details() or ""


async def timed(call: Any) -> float:
    started = time.monotonic()
    await call
    return time.monotonic() - started


async def test_a_looping_template_is_stopped_at_the_limit_and_its_worker_replaced(
    stub: tokenizer_pb2_grpc.TokenizerStub, servicer: TokenizerServicer
) -> None:
    started = time.monotonic()
    message = await refusal(stub.Encode(chat(NESTED_LOOPS)))
    assert time.monotonic() - started < TIMEOUT_S + 5
    assert f"took longer than {TIMEOUT_S:g} s to render (--chat-template-timeout)" in message
    assert servicer._render_pool.restarts == 1
    # Both workers serve again: two renders at once, the replaced worker among them.
    replies = await asyncio.gather(stub.Encode(chat()), stub.Encode(chat()))
    assert replies[0].prompt_text.endswith("<|im_start|>assistant\n") and replies[0] == replies[1]


async def test_while_a_template_loops_other_requests_are_answered_at_once(
    stub: tokenizer_pb2_grpc.TokenizerStub,
) -> None:
    attack = asyncio.ensure_future(refusal(stub.Encode(chat(NESTED_LOOPS))))
    await asyncio.sleep(0.3)  # the worker is rendering
    assert not attack.done()
    assert await timed(stub.Encode(tokenizer_pb2.EncodeRequest(text="The sky is"))) < PROMPT_ANSWER_S
    assert await timed(stub.Encode(chat())) < PROMPT_ANSWER_S  # the other worker renders
    assert await timed(stub.Decode(tokenizer_pb2.DecodeRequest(token_ids=[504, 3575]))) < PROMPT_ANSWER_S
    assert not attack.done()
    assert "--chat-template-timeout" in await attack


async def test_a_long_prompt_under_the_limit_does_not_hold_up_short_ones(
    stub: tokenizer_pb2_grpc.TokenizerStub,
) -> None:
    # One 1.5 MB word: seconds of BPE merges in Rust, which hold the GIL unless called through encode_batch.
    long = asyncio.ensure_future(stub.Encode(tokenizer_pb2.EncodeRequest(text="a" * 1_500_000)))
    await asyncio.sleep(0.3)
    assert not long.done()
    for _ in range(3):
        # Threads, not processes: on a loaded 2-core machine the long encode's thread takes a core's share.
        assert await timed(stub.Encode(tokenizer_pb2.EncodeRequest(text="The sky is"))) < 2 * PROMPT_ANSWER_S
    assert not long.done()  # answered while the long one still ran: it did not queue behind it
    assert len((await long).input_ids) > 0


async def test_a_prompt_over_the_limit_is_refused_before_encoding(stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
    started = time.monotonic()
    message = await refusal(stub.Encode(tokenizer_pb2.EncodeRequest(text="a" * 10_000_000)))
    assert time.monotonic() - started < BIG_REFUSAL_S
    assert f"the prompt is longer than {4 << 20} bytes (--max-prompt-bytes)" in message
    # Counted in bytes, not characters: 1.5 Mi three-byte characters are 4.5 MiB.
    message = await refusal(stub.Encode(tokenizer_pb2.EncodeRequest(text="€" * (3 << 19))))
    assert f"the prompt is {9 << 19} bytes; at most {4 << 20} (--max-prompt-bytes)" in message


async def test_a_chat_rendering_past_the_limit_is_refused(stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
    message = await refusal(stub.Encode(chat("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}")))
    assert f"output is longer than {4 << 20} characters (--max-prompt-bytes)" in message


async def test_a_template_that_builds_a_huge_string_runs_out_of_its_workers_memory(
    stub: tokenizer_pb2_grpc.TokenizerStub,
) -> None:
    message = await refusal(stub.Encode(chat("{{ 'x' | center(4000000000) }}")))
    assert "ran out of memory" in message
    assert (await stub.Encode(chat())).prompt_text.endswith("assistant\n")


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{% include 'x.jinja' %}", "chat templates cannot use {% include %}"),
        ("{% import 'x.jinja' as x %}", "chat templates cannot use {% import %}"),
        ("{% extends 'x.jinja' %}", "chat templates cannot use {% extends %}"),
        ("{{ messages + 1 }}", 'TypeError: can only concatenate list (not "int") to list'),
        ("{% for %}", "chat template syntax error (line 1)"),
        ("{{ raise_exception('no system role') }}", "chat template failed: no system role"),
    ],
)
async def test_a_template_error_is_invalid_argument_with_its_message(
    stub: tokenizer_pb2_grpc.TokenizerStub, template: str, message: str
) -> None:
    assert message in await refusal(stub.Encode(chat(template)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"messages": 5}, "chat_template_kwargs may not set 'messages'"),
        ({"tools": "x"}, "chat_template_kwargs 'tools' must be a list of objects, got a string"),
        ({"documents": [1]}, "chat_template_kwargs 'documents' must be a list of objects, got a list"),
        ({"add_generation_prompt": "yes"}, "chat_template_kwargs 'add_generation_prompt' must be a boolean"),
    ],
)
async def test_reserved_template_variables_of_the_wrong_type_are_refused(
    stub: tokenizer_pb2_grpc.TokenizerStub, kwargs: dict[str, Any], message: str
) -> None:
    assert message in await refusal(stub.Encode(chat(kwargs=kwargs)))


async def test_reserved_template_variables_of_the_right_type_apply(stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
    reply = await stub.Encode(chat(kwargs={"add_generation_prompt": False, "enable_thinking": True}))
    assert reply.prompt_text.endswith("Hello there<|im_end|>\n")


async def test_id_and_text_lists_are_bounded(stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
    assert await stub.Decode(tokenizer_pb2.DecodeRequest(token_ids=[504] * 1000))
    message = await refusal(stub.Decode(tokenizer_pb2.DecodeRequest(token_ids=[504] * 1001)))
    assert "Decode: 1001 token ids; at most 1000 (--max-token-ids)" in message
    message = await refusal(stub.TokenTexts(tokenizer_pb2.TokenTextsRequest(token_ids=[504] * 1001)))
    assert "TokenTexts: 1001 token ids; at most 1000 (--max-token-ids)" in message
    message = await refusal(stub.EncodeTexts(tokenizer_pb2.EncodeTextsRequest(texts=["a"] * 9)))
    assert "9 texts to encode; at most 8 (--max-encode-texts)" in message
    message = await refusal(stub.EncodeTexts(tokenizer_pb2.EncodeTextsRequest(texts=["a" * 3_000_000] * 2)))
    assert "the texts together is longer than" in message
