"""Tokenizer.EncodeStream: many Encode calls carried by one, each answered exactly as its own Encode
call; driven by the router's side of it (services/router/encode_mux.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc import aio

from services.router.encode_mux import EncodeMux
from services.tokenizer.service import TokenizerServicer
from services.tokenizer.text_tokenizer import TextTokenizer
from tests.router.conftest import eventually
from tests.tokenizer.test_service import text_tokenizer
from turnout.errors import StatusInterceptor
from turnout.grpc_server import client_channel
from turnout.telemetry.rpc_metrics import RpcMetrics
from turnout.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc

__all__ = ["text_tokenizer"]  # the fixture, re-used

# Generous: a busy machine slows every step, never the outcome.
WAIT_S = 60.0
HELD = "hold this one"  # the text whose Encode waits for `_Counting.release`


class _Counting(TokenizerServicer):
    """The real servicer, counting the carrier messages it reads and the items in them. An Encode of HELD
    waits for `release`, and says when it started and whether it was cancelled."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.messages = 0
        self.items = 0
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = 0

    async def Encode(self, request: Any, context: Any) -> Any:
        if request.text == HELD:
            self.held.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        return await super().Encode(request, context)

    async def EncodeStream(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        async def counted() -> AsyncIterator[Any]:
            async for message in requests:
                self.messages += 1
                self.items += len(message.items)
                yield message

        async for answers in super().EncodeStream(counted(), context):
            yield answers


class _Tokenizer:
    def __init__(self, stub: tokenizer_pb2_grpc.TokenizerStub, servicer: _Counting, metrics: RpcMetrics) -> None:
        self.stub = stub
        self.servicer = servicer
        self.metrics = metrics

    def count(self, code: str) -> float:
        return float(self.metrics.requests.labels("Encode", code)._value.get())


@pytest.fixture
async def tokenizer(text_tokenizer: TextTokenizer) -> AsyncIterator[_Tokenizer]:
    metrics = RpcMetrics("tokenizer")
    server = aio.server(interceptors=[metrics, StatusInterceptor()])
    servicer = _Counting(text_tokenizer, carried_metrics=metrics)
    tokenizer_pb2_grpc.add_TokenizerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with client_channel(f"127.0.0.1:{port}") as channel:
        yield _Tokenizer(tokenizer_pb2_grpc.TokenizerStub(channel), servicer, metrics)
    await server.stop(0)
    await servicer.close()


def _chat(text: str) -> tokenizer_pb2.EncodeRequest:
    messages = [common_pb2.ChatMessage(role="user", content=text)]
    return tokenizer_pb2.EncodeRequest(chat=common_pb2.ChatInput(messages=messages))


REQUESTS = [
    tokenizer_pb2.EncodeRequest(text="The quick brown fox jumps over the lazy dog."),
    tokenizer_pb2.EncodeRequest(text="é🎉 and more", add_special_tokens=False),
    _chat("What is the capital of France?"),
]


async def test_carried_calls_answer_as_their_own_calls_and_share_messages(tokenizer: _Tokenizer) -> None:
    alone = [await tokenizer.stub.Encode(request) for request in REQUESTS]
    assert all(response.input_ids for response in alone)
    mux = EncodeMux(tokenizer.stub)
    carried = await asyncio.gather(*(mux.encode(request) for request in REQUESTS * 4))
    assert carried == alone * 4
    # Twelve calls made in one turn of the loop: they travelled together, several items per message.
    assert tokenizer.servicer.items == 12 and tokenizer.servicer.messages <= 6
    # Each carried call counts as an Encode call, as its own call did.
    assert tokenizer.count("OK") == 3 + 12
    await mux.close()


async def test_a_refused_call_is_that_calls_status_and_spares_the_others(tokenizer: _Tokenizer) -> None:
    with pytest.raises(aio.AioRpcError) as own_call:
        await tokenizer.stub.Encode(tokenizer_pb2.EncodeRequest())
    mux = EncodeMux(tokenizer.stub)
    results = await asyncio.gather(
        mux.encode(tokenizer_pb2.EncodeRequest()), mux.encode(REQUESTS[0]), return_exceptions=True
    )
    refused, good = results
    assert isinstance(refused, aio.AioRpcError)
    assert refused.code() is grpc.StatusCode.INVALID_ARGUMENT is own_call.value.code()
    assert refused.details() == own_call.value.details() and "`text` or `chat`" in (refused.details() or "")
    assert good == await tokenizer.stub.Encode(REQUESTS[0])
    assert tokenizer.count("INVALID_ARGUMENT") == 2
    await mux.close()


async def test_a_caller_that_stops_waiting_cancels_its_call_on_the_tokenizer(tokenizer: _Tokenizer) -> None:
    mux = EncodeMux(tokenizer.stub)
    waiting = asyncio.create_task(mux.encode(tokenizer_pb2.EncodeRequest(text=HELD)))
    await asyncio.wait_for(tokenizer.servicer.held.wait(), WAIT_S)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await eventually(lambda: tokenizer.servicer.cancelled == 1, WAIT_S)
    await eventually(lambda: tokenizer.count("CANCELLED") == 1, WAIT_S)
    # The carrier goes on carrying.
    assert await mux.encode(REQUESTS[0]) == await tokenizer.stub.Encode(REQUESTS[0])
    await mux.close()


async def test_a_lost_carrier_fails_its_calls_and_the_next_call_opens_a_new_one(tokenizer: _Tokenizer) -> None:
    mux = EncodeMux(tokenizer.stub)
    waiting = asyncio.create_task(mux.encode(tokenizer_pb2.EncodeRequest(text=HELD)))
    await asyncio.wait_for(tokenizer.servicer.held.wait(), WAIT_S)
    carrier = mux.carrier.current
    assert carrier is not None
    carrier._call.cancel()  # the stream breaks under it, as a dead tokenizer's would
    with pytest.raises(aio.AioRpcError) as lost:
        await waiting
    assert lost.value.code() is grpc.StatusCode.CANCELLED
    await eventually(lambda: tokenizer.servicer.cancelled == 1, WAIT_S)  # its call stopped with the carrier
    assert await mux.encode(REQUESTS[0]) == await tokenizer.stub.Encode(REQUESTS[0])
    assert mux.carrier.current is not carrier
    await mux.close()


async def test_draining_refuses_new_calls_and_ends_the_carrier_once_its_calls_have(tokenizer: _Tokenizer) -> None:
    mux = EncodeMux(tokenizer.stub)
    running = asyncio.create_task(mux.encode(tokenizer_pb2.EncodeRequest(text=HELD)))
    await asyncio.wait_for(tokenizer.servicer.held.wait(), WAIT_S)
    carrier = mux.carrier.current
    tokenizer.servicer.drain()
    with pytest.raises(aio.AioRpcError) as refused:
        await mux.encode(REQUESTS[0])
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE and "shutting down" in (refused.value.details() or "")
    # The running call is answered; then the carrier ends, with the router's side still open.
    assert mux.carrier.current is carrier
    tokenizer.servicer.release.set()
    assert list((await running).input_ids)
    await eventually(lambda: mux.carrier.current is None, WAIT_S)  # the tokenizer ended it
    await mux.close()
