"""`turnout.client` against a fake router (a real grpc.aio server on loopback)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from grpc import aio

from tests.gateway.conftest import FakeRouter, chunk, complete, default_script, fake_encode
from turnout.client import AsyncClient, Client, Completion, Delta, TurnoutError
from turnout.v1 import inference_pb2_grpc


@pytest.fixture
async def router() -> AsyncIterator[FakeRouter]:
    server = aio.server()
    fake = FakeRouter()
    inference_pb2_grpc.add_InferenceServicer_to_server(fake, server)
    fake.address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    yield fake
    await server.stop(0)


async def endless(request: Any, context: Any) -> AsyncIterator[Any]:
    i = 0
    while True:
        i += 1
        yield chunk(0, "x", (i,), completion=i)
        await asyncio.sleep(0.01)


async def test_async_generate_stream_and_metadata(router: FakeRouter) -> None:
    async with AsyncClient(router.address) as client:
        [done] = await client.generate("Hi", max_new_tokens=4, temperature=0.0, request_id="r1")
        assert done == Completion(0, "stop", 2, 5, 3, 1, "Hello world", (11, 12, 13))
        sent = router.requests[-1]
        assert (sent.text, sent.request_id, sent.sampling_params.max_new_tokens) == ("Hi", "r1", 4)
        assert sent.sampling_params.HasField("temperature")

        events = [e async for e in client.generate_stream([5, 6], n=2)]
        assert list(router.requests[-1].input_ids.ids) == [5, 6]
        deltas = [e for e in events if isinstance(e, Delta)]
        assert "".join(d.text for d in deltas if d.index == 1) == "Hello world"
        assert [e.index for e in events if isinstance(e, Completion)] == [0, 1]

        await client.generate(messages=[{"role": "user", "content": "hey"}], chat_options={"chat_template": "t"})
        assert router.requests[-1].chat.options.chat_template == "t"

        tokens = await client.tokenize("ab", return_token_strs=True)
        assert tokens.ids == tuple(fake_encode("ab")) and tokens.token_strs == ("<s>", "a", "b")
        assert await client.detokenize(tokens.ids) == "ab"
        [model] = await client.list_models()
        assert (model.name, model.max_model_len) == ("tiny", 2048)
        assert await client.model_info() == model


async def test_async_errors_are_typed(router: FakeRouter) -> None:
    async with AsyncClient(router.address) as client:
        with pytest.raises(TurnoutError) as caught:
            await client.generate("Hi", model="nope")
        assert caught.value.code == grpc.StatusCode.NOT_FOUND and "nope" in caught.value.details
        with pytest.raises(TurnoutError) as info:
            await client.model_info("nope")
        assert info.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(ValueError, match="temprature"):
            await client.generate("Hi", temprature=0.5)
        with pytest.raises(ValueError, match="exactly one"):
            await client.generate()


async def test_async_cancel_stops_the_router(router: FakeRouter) -> None:
    router.script = endless
    async with AsyncClient(router.address) as client:
        stream = client.generate_stream("Hi")
        async for event in stream:
            assert isinstance(event, Delta)
            break  # leaving the loop closes the stream, which cancels the call
        await asyncio.wait_for(router.cancelled.wait(), 5)


async def test_async_requests_share_one_generate_stream(router: FakeRouter) -> None:
    # Carried as the gateway carries its requests: what is ready for all of them comes in one message.
    async with AsyncClient(router.address) as client:
        done = await asyncio.gather(*(client.generate("Hi", max_new_tokens=3) for _ in range(8)))
        events = [e async for e in client.generate_stream("Hi", n=2)]
    assert [[c.text for c in d] for d in done] == [["Hello world"]] * 8
    assert sum(isinstance(e, Completion) for e in events) == 2
    assert len(router.requests) == 9 and all(r.accept_batches for r in router.requests)
    assert router.carriers == 1


async def test_async_timeout_ends_each_request_on_the_router(router: FakeRouter) -> None:
    router.script = endless
    async with AsyncClient(router.address, timeout_s=1.5) as client:
        with pytest.raises(TurnoutError) as caught:
            await client.generate("Hi")
        assert caught.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(router.cancelled.wait(), 5)
        # The stream goes on carrying the next request.
        router.script = default_script
        [done] = await client.generate("Hi")
        assert done.text == "Hello world"
    assert router.carriers == 1


async def batched(request: Any, context: Any) -> AsyncIterator[Any]:
    """The router's answer to a reader that lagged: three steps and the end in one message."""
    assert request.accept_batches
    message = chunk(0, "a", (1,), completion=1)
    message.batch.extend(
        [chunk(0, "b", (2,), completion=2), chunk(0, "c", (3,), completion=3), complete(0, token_id=3)]
    )
    yield message


async def test_both_clients_read_batches(router: FakeRouter) -> None:
    router.script = batched
    async with AsyncClient(router.address) as client:
        [done] = await client.generate("Hi")
        events = [e async for e in client.generate_stream("Hi")]
    assert (done.text, done.token_ids) == ("abc", (1, 2, 3))
    assert [e.text for e in events if isinstance(e, Delta)] == ["a", "b", "c"]

    def work() -> tuple[list[Completion], list[Any]]:
        with Client(router.address, timeout_s=10) as client:
            return client.generate("Hi"), list(client.generate_stream("Hi"))

    [sync_done], sync_events = await asyncio.to_thread(work)
    assert sync_done == done
    assert sync_events == events


async def test_sync_client(router: FakeRouter) -> None:
    def work() -> tuple[list[Completion], list[Any]]:
        with Client(router.address, timeout_s=10) as client:
            done = client.generate("Hi", max_new_tokens=2)
            with pytest.raises(TurnoutError) as caught:
                client.tokenize("x", model="nope")
            assert caught.value.code == grpc.StatusCode.NOT_FOUND
            router.script = endless
            seen = []
            with client.generate_stream("Hi") as stream:
                for event in stream:
                    seen.append(event)
                    if len(seen) == 3:
                        break
            return done, seen

    done, seen = await asyncio.to_thread(work)
    assert done[0].text == "Hello world" and done[0].finish_reason == "stop"
    assert [e.token_ids for e in seen] == [(1,), (2,), (3,)]
    await asyncio.wait_for(router.cancelled.wait(), 5)
