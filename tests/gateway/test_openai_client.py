"""The official `openai` client against the gateway over real sockets: the shapes it parses are ours."""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.gateway.conftest import FakeRouter

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


async def test_sdk_completion_models_and_errors(sdk: openai.AsyncOpenAI) -> None:
    reply = await sdk.completions.create(model="tiny", prompt="x", extra_body={"top_k": 5})
    assert reply.choices[0].text == "Hello world"
    assert [m.id for m in (await sdk.models.list()).data] == ["tiny"]
    with pytest.raises(openai.NotFoundError):
        await sdk.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError) as bad:
        await sdk.completions.create(model="tiny", prompt="x", temperature=-1)
    assert "temperature" in str(bad.value)
