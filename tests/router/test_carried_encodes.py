"""The router encodes prompts over one Tokenizer.EncodeStream per tokenizer (services/router/encode_mux.py),
not a unary Encode call per request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from grpc import aio

from tests.router.conftest import FakeTokenizer, eventually, text_of
from turnout.errors import InvalidArgument
from turnout.v1 import inference_pb2


class _Watching(FakeTokenizer):
    """Counts its own Encode calls apart from the Encodes carried by EncodeStream; an Encode of "hold"
    waits until cancelled."""

    def __init__(self) -> None:
        super().__init__()
        self.unary_calls = 0
        self.carriers = 0
        self.carried = 0
        self.held = asyncio.Event()
        self.cancelled = 0

    async def Encode(self, request: Any, context: Any) -> Any:
        if context is not None:
            self.unary_calls += 1
        if request.text == "hold":
            self.held.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return await super().Encode(request, context)

    async def EncodeStream(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        self.carriers += 1

        async def counted() -> AsyncIterator[Any]:
            async for message in requests:
                self.carried += len([item for item in message.items if item.HasField("request")])
                yield message

        async for answers in super().EncodeStream(counted(), context):
            yield answers


async def test_every_prompt_is_encoded_over_one_stream(make_cluster: Callable[..., Any]) -> None:
    tokenizer = _Watching()
    cluster = await make_cluster(1, tokenizer_servicer=tokenizer)
    prompts = [f"p{i}" for i in range(6)]
    results = await asyncio.gather(*(cluster.generate(prompt) for prompt in prompts))
    assert [text_of(responses) for responses in results] == ["<100><101><102>"] * len(prompts)
    # FakeTokenizer: one token per character.
    received = sorted(list(request.input_ids) for request in cluster.engines[0].received)
    assert received == sorted([ord(c) for c in prompt] for prompt in prompts)
    reply = await cluster.inference.Tokenize(inference_pb2.TokenizeRequest(text="abc"))
    assert list(reply.input_ids) == [97, 98, 99]
    assert tokenizer.unary_calls == 0
    assert tokenizer.carriers == 1 and tokenizer.carried == len(prompts) + 1


async def test_a_request_cancelled_while_its_prompt_is_encoded_cancels_the_encode(
    make_cluster: Callable[..., Any],
) -> None:
    tokenizer = _Watching()
    cluster = await make_cluster(1, tokenizer_servicer=tokenizer)
    call = cluster.inference.Generate(inference_pb2.GenerateRequest(text="hold"))
    reading = asyncio.ensure_future(call.read())
    await asyncio.wait_for(tokenizer.held.wait(), 30)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    await eventually(lambda: tokenizer.cancelled == 1, 30)
    # The carrier still carries the next prompt.
    assert text_of(await cluster.generate("ab")) == "<100><101><102>"
    assert tokenizer.carriers == 1


async def test_a_refused_prompt_fails_its_request_with_the_tokenizers_status(make_cluster: Callable[..., Any]) -> None:
    class Refusing(FakeTokenizer):
        async def Encode(self, request: Any, context: Any) -> Any:
            raise InvalidArgument("the prompt is 9 bytes over --max-prompt-bytes")

    cluster = await make_cluster(1, tokenizer_servicer=Refusing())
    with pytest.raises(aio.AioRpcError) as refused:
        await cluster.generate("hello")
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "the prompt is 9 bytes over --max-prompt-bytes"
