"""The official `openai` client against the gateway over real sockets: the shapes it parses are ours."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.conftest import FakeRouter, chunk, complete
from turnout.v1 import common_pb2

CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi"}]


@pytest.fixture
async def sdk(live_gateway: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{live_gateway}/v1", api_key="unused", max_retries=0) as client:
        yield client


async def test_sdk_chat_and_stream(sdk: openai.AsyncOpenAI, fake_router: FakeRouter) -> None:
    reply = await sdk.chat.completions.create(model="tiny", messages=CHAT, max_completion_tokens=4)
    assert reply.choices[0].message.content == "Hello world"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.total_tokens == 8
    stream = await sdk.chat.completions.create(
        model="tiny",
        messages=CHAT,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello world"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert fake_router.requests[0].sampling_params.max_new_tokens == 4


async def test_sdk_completion_models_and_errors(sdk: openai.AsyncOpenAI, fake_router: FakeRouter) -> None:
    reply = await sdk.completions.create(model="tiny", prompt="x", extra_body={"top_k": 5})
    assert reply.choices[0].text == "Hello world"
    assert [m.id for m in (await sdk.models.list()).data] == ["tiny"]
    with pytest.raises(openai.NotFoundError):
        await sdk.completions.create(model="nope", prompt="x")

    async def engine(request, context):  # type: ignore[no-untyped-def]
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "temperature must be a non-negative finite number")
        yield  # pragma: no cover

    fake_router.script = engine
    with pytest.raises(openai.BadRequestError) as bad:
        await sdk.completions.create(model="tiny", prompt="x", temperature=-1)
    assert "temperature must be a non-negative finite number" in str(bad.value)


async def test_sdk_parses_logprobs(sdk: openai.AsyncOpenAI, fake_router: FakeRouter) -> None:
    token = common_pb2.TokenLogprob(token_id=11, logprob=-0.5, text="Hi", token_bytes=b"Hi", rank=1)
    position = common_pb2.PositionLogprobs(token=token, top=[token])

    async def script(request, context):  # type: ignore[no-untyped-def]
        yield chunk(0, "Hi", (11,), completion=1, logprobs=[position])
        yield complete(0, stop_str="END")

    fake_router.script = script
    chat = await sdk.chat.completions.create(model="tiny", messages=CHAT, logprobs=True, top_logprobs=1)
    assert chat.choices[0].logprobs is not None and chat.choices[0].logprobs.content is not None
    assert chat.choices[0].logprobs.content[0].bytes == list(b"Hi")
    completion = await sdk.completions.create(model="tiny", prompt="x", logprobs=1)
    assert completion.choices[0].logprobs is not None
    assert completion.choices[0].logprobs.top_logprobs == [{"Hi": -0.5}]
