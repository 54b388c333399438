"""The gateway's Generate calls carried by one Inference.GenerateStream: each reads like its own call.

Against the fake router over real gRPC (its GenerateStream runs its Generate per carried stream, as
the router's does); the router's own carrier (draining, its Generate) is in tests/router."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import httpx
import pytest
from grpc import aio

from tests.gateway.conftest import FakeRouter, chunk, complete, default_script, serving
from turnout import carried_streams
from turnout.generate_carrier import CarriedGenerate, GenerateCarrier
from turnout.grpc_server import client_channel
from turnout.v1 import inference_pb2, inference_pb2_grpc

# Generous: a busy machine slows every exchange, never the outcome.
WAIT_S = 60.0


class CountingRouter(FakeRouter):
    """Records the messages its carriers' answers came in."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[inference_pb2.GenerateStreamResponse] = []

    async def GenerateStream(self, requests: Any, context: Any) -> AsyncIterator[Any]:
        async for message in super().GenerateStream(requests, context):
            self.messages.append(message)
            yield message


@pytest.fixture
async def router() -> AsyncIterator[CountingRouter]:
    async with serving(CountingRouter()) as fake:
        yield fake


@pytest.fixture
async def stub(router: CountingRouter) -> AsyncIterator[inference_pb2_grpc.InferenceStub]:
    async with client_channel(router.address) as channel:
        yield inference_pb2_grpc.InferenceStub(channel)


async def _read_all(call: Any) -> list[inference_pb2.GenerateResponse]:
    """To the end: a call's read gives aio.EOF there, a carried stream's None."""
    responses = []
    while (response := await asyncio.wait_for(call.read(), WAIT_S)) not in (aio.EOF, None):
        responses.append(response)
    return responses


async def _error_of(call: CarriedGenerate) -> aio.AioRpcError:
    with pytest.raises(aio.AioRpcError) as caught:
        await _read_all(call)
    return caught.value


def _request(request_id: str, n: int = 1) -> inference_pb2.GenerateRequest:
    request = inference_pb2.GenerateRequest(request_id=request_id, accept_batches=True)
    if n != 1:
        request.sampling_params.n = n
    return request


async def _eventually(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        await asyncio.sleep(0.01)


async def test_streams_share_one_carrier_and_read_like_their_own_calls(
    router: CountingRouter, stub: inference_pb2_grpc.InferenceStub
) -> None:
    expected = await _read_all(stub.Generate(_request("alone", n=2)))
    carrier = GenerateCarrier(stub)
    calls = [carrier.generate(_request(f"r{i}", n=2), timeout_s=None) for i in range(8)]
    results = await asyncio.gather(*(_read_all(call) for call in calls))
    assert all(result == expected for result in results)  # the same messages, in the same order
    assert router.carriers == 1
    # The 8 streams started in one turn went out together, and their answers shared messages.
    assert len(router.messages) < sum(len(r) + 1 for r in results)
    assert max(len(m.items) for m in router.messages) > 1
    await carrier.close()


async def test_a_refusal_ends_its_stream_with_its_status_and_spares_the_others(
    router: CountingRouter, stub: inference_pb2_grpc.InferenceStub
) -> None:
    async def script(request: Any, context: Any) -> AsyncIterator[inference_pb2.GenerateResponse]:
        if request.request_id == "bad":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "temperature must be >= 0")
        async for response in default_script(request, context):
            yield response

    router.script = script
    carrier = GenerateCarrier(stub)
    good, bad = carrier.generate(_request("good"), None), carrier.generate(_request("bad"), None)
    error = await _error_of(bad)
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT and error.details() == "temperature must be >= 0"
    assert [r.WhichOneof("kind") for r in await _read_all(good)][-1] == "complete"
    # An unknown model: the fake's own refusal, NOT_FOUND as its call would end.
    unknown = inference_pb2.GenerateRequest(model="other")
    assert (await _error_of(carrier.generate(unknown, None))).code() is grpc.StatusCode.NOT_FOUND
    assert router.carriers == 1
    await carrier.close()


async def _forever(request: Any, context: Any) -> AsyncIterator[inference_pb2.GenerateResponse]:
    yield chunk(0, "Hello", (11,), completion=1)
    await asyncio.sleep(3600)
    yield complete(0, token_id=2)


async def test_cancel_stops_the_stream_on_the_router(
    router: CountingRouter, stub: inference_pb2_grpc.InferenceStub
) -> None:
    router.script = _forever
    carrier = GenerateCarrier(stub)
    call = carrier.generate(_request("r"), None)
    other = carrier.generate(_request("other"), None)
    assert (await call.read()).chunk.text == "Hello"
    assert call.cancel() and not call.cancel()
    await asyncio.wait_for(router.cancelled.wait(), WAIT_S)
    assert (await _error_of(call)).code() is grpc.StatusCode.CANCELLED
    assert (await other.read()).chunk.text == "Hello"  # the carrier and the other stream go on
    other.cancel()
    await carrier.close()


async def test_the_deadline_cancels_the_stream_as_a_calls_deadline_does(
    router: CountingRouter, stub: inference_pb2_grpc.InferenceStub
) -> None:
    router.script = _forever
    carrier = GenerateCarrier(stub)
    call = carrier.generate(_request("r"), timeout_s=0.3)
    assert (await call.read()).chunk.text == "Hello"
    assert (await _error_of(call)).code() is grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.wait_for(router.cancelled.wait(), WAIT_S)  # and the router stopped generating
    # A stream that ended in time keeps no timer that could fail it later.
    router.script = default_script
    done = carrier.generate(_request("quick"), timeout_s=0.3)
    responses = await _read_all(done)
    await asyncio.sleep(0.5)
    assert await done.read() is None and responses[-1].WhichOneof("kind") == "complete"
    await carrier.close()


async def test_a_lost_router_fails_its_streams_and_the_next_request_opens_a_new_carrier() -> None:
    fake = CountingRouter()
    server = aio.server()
    inference_pb2_grpc.add_InferenceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    fake.script = _forever
    async with client_channel(f"127.0.0.1:{port}") as channel:
        carrier = GenerateCarrier(inference_pb2_grpc.InferenceStub(channel))
        calls = [carrier.generate(_request(f"r{i}"), None) for i in range(3)]
        for call in calls:
            assert (await call.read()).chunk.text == "Hello"
        await server.stop(0)
        for call in calls:
            assert (await _error_of(call)).code() is grpc.StatusCode.UNAVAILABLE
        server = aio.server()
        inference_pb2_grpc.add_InferenceServicer_to_server(fake, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        fake.script = default_script
        try:
            deadline = time.monotonic() + WAIT_S
            while True:  # the channel reconnects; until then a new carrier fails at once, UNAVAILABLE
                try:
                    responses = await _read_all(carrier.generate(_request("again"), None))
                    break
                except aio.AioRpcError as exc:
                    assert exc.code() is grpc.StatusCode.UNAVAILABLE and time.monotonic() < deadline
                    await asyncio.sleep(0.05)
            assert responses[-1].WhichOneof("kind") == "complete"
            assert fake.carriers >= 2
        finally:
            await carrier.close()
            await server.stop(0)


class _CoreFailureCall:
    """A GenerateStream call that ends as gRPC's aio ends one whose write failed in its core (the router
    died while this side was writing): INTERNAL with gRPC's own words, the router's status lost."""

    def __init__(self, requests: AsyncIterator[inference_pb2.GenerateStreamRequest]) -> None:
        self._requests = requests

    def __aiter__(self) -> AsyncIterator[inference_pb2.GenerateStreamResponse]:
        return self._answers()

    async def _answers(self) -> AsyncIterator[inference_pb2.GenerateStreamResponse]:
        await anext(self._requests)  # the first streams went out
        raise carried_streams.call_error(grpc.StatusCode.INTERNAL, "Internal error from Core")
        yield  # an async generator

    def cancel(self) -> bool:
        return False


class _CoreFailureStub:
    def GenerateStream(self, requests: Any) -> _CoreFailureCall:
        return _CoreFailureCall(requests)


async def test_a_carrier_whose_status_grpc_lost_fails_its_streams_unavailable() -> None:
    """INTERNAL would be a 500 naming gRPC's core; the router is gone, so UNAVAILABLE: RouterClient waits
    for it and tries again, else a 503 naming it (seen in the supervisor test's router kill)."""
    carrier = GenerateCarrier(_CoreFailureStub())  # type: ignore[arg-type]
    calls = [carrier.generate(_request(f"r{i}"), None) for i in range(2)]
    try:
        for call in calls:
            error = await _error_of(call)
            assert error.code() is grpc.StatusCode.UNAVAILABLE, error
            assert "the router's GenerateStream broke" in error.details()
    finally:
        await carrier.close()


async def test_http_requests_go_over_one_carrier(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    """The gateway's own client: every HTTP request's Generate is carried (one GenerateStream for all)."""
    replies = await asyncio.gather(
        *(client.post("/v1/completions", json={"prompt": "hi", "stream": i % 2 == 0}) for i in range(6))
    )
    assert all(reply.status_code == 200 for reply in replies), [r.text for r in replies]
    assert len(fake_router.requests) == 6 and fake_router.carriers == 1


async def test_big_requests_are_split_over_messages_and_one_too_big_fails_alone(
    router: CountingRouter, stub: inference_pb2_grpc.InferenceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many requests started together must not make a message the router refuses (which would break the
    carrier under all of them); a request too big to send at all fails alone, RESOURCE_EXHAUSTED."""
    monkeypatch.setattr(carried_streams, "MESSAGE_BUDGET", 600)
    monkeypatch.setattr(carried_streams, "ITEM_LIMIT", 1500)
    incoming: list[int] = []  # commands per message the router read
    serve = FakeRouter.GenerateStream

    async def counted(self: FakeRouter, requests: Any, context: Any) -> AsyncIterator[Any]:
        async def messages() -> AsyncIterator[Any]:
            async for message in requests:
                incoming.append(len(message.items))
                yield message

        async for message in serve(self, messages(), context):
            yield message

    monkeypatch.setattr(FakeRouter, "GenerateStream", counted)
    carrier = GenerateCarrier(stub)
    calls = [
        carrier.generate(inference_pb2.GenerateRequest(request_id=f"r{i}", text="x" * 250), None) for i in range(4)
    ]
    too_big = carrier.generate(inference_pb2.GenerateRequest(request_id="big", text="x" * 2000), None)
    error = await _error_of(too_big)
    assert error.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and "bytes a message may carry" in error.details()
    for call in calls:
        assert (await _read_all(call))[-1].WhichOneof("kind") == "complete"
    assert sum(incoming) == 4 and len(incoming) >= 2  # every request arrived, over several messages
    assert router.carriers == 1
    await carrier.close()
