"""Tokenizer.DetokenizeStream: many samples' Detokenize streams carried by one, each answered exactly
as its own Detokenize call; driven by the router's side of it (services/router/detokenize_mux.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc import aio

from services.router.detokenize_mux import DetokenizeMux
from services.tokenizer.service import TokenizerServicer
from services.tokenizer.text_tokenizer import TextTokenizer
from tests.router.conftest import eventually
from tests.tokenizer.test_service import detokenize, ids_of, text_tokenizer
from turnout.errors import StatusInterceptor
from turnout.grpc_server import client_channel
from turnout.telemetry.rpc_metrics import RpcMetrics
from turnout.v1 import tokenizer_pb2, tokenizer_pb2_grpc

__all__ = ["text_tokenizer"]  # the fixture, re-used

# Generous: a busy machine slows every step, never the outcome.
WAIT_S = 60.0
TEXT = "The quick brown fox jumps over the lazy dog. STOP here"


class _Counting(TokenizerServicer):
    """The real servicer, counting the carrier messages it reads and the items in them."""

    messages = 0
    items = 0

    async def DetokenizeStream(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        async def counted() -> AsyncIterator[Any]:
            async for message in requests:
                self.messages += 1
                self.items += len(message.items)
                yield message

        async for answers in super().DetokenizeStream(counted(), context):
            yield answers


class _Tokenizer:
    def __init__(self, stub: tokenizer_pb2_grpc.TokenizerStub, servicer: _Counting, metrics: RpcMetrics) -> None:
        self.stub = stub
        self.servicer = servicer
        self.metrics = metrics


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


async def _carried(
    mux: DetokenizeMux, start: tokenizer_pb2.DetokenizeStart, ids: list[int]
) -> list[tokenizer_pb2.DetokenizeResponse]:
    """As tests/tokenizer/test_service.py's `detokenize`, over the carrier."""
    stream = mux.open()
    assert await stream.exchange(tokenizer_pb2.DetokenizeRequest(start=start)) == tokenizer_pb2.DetokenizeResponse()
    responses = []
    for index, token_id in enumerate(ids):
        tokens = tokenizer_pb2.DetokenizeTokens(token_ids=[token_id], last=index == len(ids) - 1)
        response = await stream.exchange(tokenizer_pb2.DetokenizeRequest(tokens=tokens))
        responses.append(response)
        if response.HasField("matched_stop"):
            break
    stream.close()
    return responses


async def test_carried_streams_answer_as_their_own_calls_and_share_messages(
    tokenizer: _Tokenizer, text_tokenizer: TextTokenizer
) -> None:
    ids = ids_of(text_tokenizer, TEXT)
    starts = [
        tokenizer_pb2.DetokenizeStart(request_id="plain"),
        tokenizer_pb2.DetokenizeStart(request_id="stop", stop=["STOP"]),
    ]
    alone = [await detokenize(tokenizer.stub, start, ids) for start in starts]
    mux = DetokenizeMux(tokenizer.stub)
    carried = await asyncio.gather(*(_carried(mux, start, ids) for start in starts * 4))
    assert carried == alone * 4  # every answer, in order, as its own call gave it
    assert "".join(r.text for r in carried[1]) == "The quick brown fox jumps over the lazy dog. "
    # Eight streams in step: their exchanges travelled together, several items per carrier message.
    assert tokenizer.servicer.items >= 2 * tokenizer.servicer.messages
    # Each closed carried stream counts as a Detokenize call (the closes reach the tokenizer just after).
    ok = tokenizer.metrics.requests.labels("Detokenize", "OK")
    await eventually(lambda: ok._value.get() == 2 + 8, WAIT_S)
    await mux.close()


async def test_tokens_written_in_place_are_answered_as_the_message_built_apart(
    tokenizer: _Tokenizer, text_tokenizer: TextTokenizer
) -> None:
    ids = ids_of(text_tokenizer, TEXT)
    steps = [ids[:3], ids[3:4], ids[4:-1]]
    sizes = [len(step) for step in steps]
    mux = DetokenizeMux(tokenizer.stub)
    apart, in_place = mux.open(), mux.open()
    start = tokenizer_pb2.DetokenizeRequest(start=tokenizer_pb2.DetokenizeStart(stop=["lazy"]))
    for stream in (apart, in_place):
        await stream.exchange(start)
    # Several steps in one message, then the last token alone.
    several = tokenizer_pb2.DetokenizeTokens(token_ids=ids[:-1], step_sizes=sizes)
    expected = await apart.exchange(tokenizer_pb2.DetokenizeRequest(tokens=several))
    got = await in_place.exchange_tokens(ids[:-1], step_sizes=sizes)
    assert got == expected
    assert len(got.steps) == 3 and got.steps[2].matched_stop == "lazy"  # the answers stop where it matched
    plain = mux.open(), mux.open()
    for stream in plain:
        await stream.exchange(tokenizer_pb2.DetokenizeRequest(start=tokenizer_pb2.DetokenizeStart()))
    last = tokenizer_pb2.DetokenizeTokens(token_ids=ids, last=True)
    expected = await plain[0].exchange(tokenizer_pb2.DetokenizeRequest(tokens=last))
    assert await plain[1].exchange_tokens(ids, last=True) == expected
    assert expected.text == TEXT
    await mux.close()


async def test_a_stream_ends_with_the_answer_that_ends_its_sequence_and_needs_no_close(
    tokenizer: _Tokenizer, text_tokenizer: TextTokenizer
) -> None:
    ids = ids_of(text_tokenizer, TEXT)
    starts = [tokenizer_pb2.DetokenizeStart(request_id="last"), tokenizer_pb2.DetokenizeStart(stop=["STOP"])]
    mux = DetokenizeMux(tokenizer.stub)
    carried = await asyncio.gather(*(_carried(mux, start, ids) for start in starts))
    assert carried[1][-1].matched_stop == "STOP" and len(carried[1]) < len(ids)
    # The tokenizer read each stream's start and chunks, and no close: both ended on its side, the one
    # with its last chunk's answer, the other with the answer where the stop matched.
    assert tokenizer.servicer.items == sum(1 + len(responses) for responses in carried)
    carrier = mux.carrier.current
    assert carrier is not None and not carrier._open
    ok = tokenizer.metrics.requests.labels("Detokenize", "OK")
    await eventually(lambda: ok._value.get() == 2, WAIT_S)
    # A stream closed before its sequence ended is closed on the tokenizer's side by a close item.
    cut = mux.open()
    await cut.exchange(tokenizer_pb2.DetokenizeRequest(start=tokenizer_pb2.DetokenizeStart()))
    tokens = tokenizer_pb2.DetokenizeTokens(token_ids=ids[:2])
    await cut.exchange(tokenizer_pb2.DetokenizeRequest(tokens=tokens))
    before = tokenizer.servicer.items
    cut.close()
    await eventually(lambda: tokenizer.servicer.items == before + 1 and ok._value.get() == 3, WAIT_S)
    await mux.close()


async def test_a_refused_start_is_that_streams_status_and_spares_the_others(
    tokenizer: _Tokenizer, text_tokenizer: TextTokenizer
) -> None:
    mux = DetokenizeMux(tokenizer.stub)
    good = asyncio.create_task(_carried(mux, tokenizer_pb2.DetokenizeStart(), ids_of(text_tokenizer, TEXT)))
    bad = mux.open()
    with pytest.raises(aio.AioRpcError) as refused:
        await bad.exchange(tokenizer_pb2.DetokenizeRequest(start=tokenizer_pb2.DetokenizeStart(stop_regex=["("])))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "stop" in (refused.value.details() or "").lower()
    assert "".join(r.text for r in await good) == TEXT
    assert tokenizer.metrics.requests.labels("Detokenize", "INVALID_ARGUMENT")._value.get() == 1
    await mux.close()


async def test_a_lost_carrier_fails_its_exchanges_and_the_next_stream_opens_a_new_one(
    tokenizer: _Tokenizer, text_tokenizer: TextTokenizer
) -> None:
    mux = DetokenizeMux(tokenizer.stub)
    first = mux.open()
    await first.exchange(tokenizer_pb2.DetokenizeRequest(start=tokenizer_pb2.DetokenizeStart()))
    carrier = mux.carrier.current
    assert carrier is not None
    carrier._call.cancel()  # the stream breaks under it, as a dead tokenizer's would
    with pytest.raises(aio.AioRpcError) as lost:
        tokens = tokenizer_pb2.DetokenizeTokens(token_ids=ids_of(text_tokenizer, "hi"), last=True)
        await first.exchange(tokenizer_pb2.DetokenizeRequest(tokens=tokens))
    assert lost.value.code() is grpc.StatusCode.CANCELLED
    assert (
        "".join(r.text for r in await _carried(mux, tokenizer_pb2.DetokenizeStart(), ids_of(text_tokenizer, TEXT)))
        == TEXT
    )
    assert mux.carrier.current is not carrier
    await mux.close()


async def test_draining_refuses_new_streams_and_ends_the_carrier_once_its_streams_have(
    tokenizer: _Tokenizer, text_tokenizer: TextTokenizer
) -> None:
    mux = DetokenizeMux(tokenizer.stub)
    running = mux.open()
    await running.exchange(tokenizer_pb2.DetokenizeRequest(start=tokenizer_pb2.DetokenizeStart()))
    carrier = mux.carrier.current
    tokenizer.servicer.drain()
    late = mux.open()
    with pytest.raises(aio.AioRpcError) as refused:
        await late.exchange(tokenizer_pb2.DetokenizeRequest(start=tokenizer_pb2.DetokenizeStart()))
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE and "shutting down" in (refused.value.details() or "")
    # The running stream is served to its end; then the carrier ends, with the router's side still open.
    tokens = tokenizer_pb2.DetokenizeTokens(token_ids=ids_of(text_tokenizer, "bye"), last=True)
    assert (await running.exchange(tokenizer_pb2.DetokenizeRequest(tokens=tokens))).text == "bye"
    assert mux.carrier.current is carrier
    running.close()
    await eventually(lambda: mux.carrier.current is None, WAIT_S)  # the tokenizer ended it
    await mux.close()
