"""The router's requests to one engine over one GenerateStream (services/router/engine_mux.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio

from services.router.engine_mux import EngineMux
from tests.router.conftest import FakeEngine, eventually
from turnout.v1 import common_pb2, engine_pb2, engine_pb2_grpc


def _request(request_id: str) -> engine_pb2.EngineGenerateRequest:
    return engine_pb2.EngineGenerateRequest(
        request_id=request_id, input_ids=[1, 2, 3], sampling_params=common_pb2.SamplingParams()
    )


async def _read_all(call: object) -> list[engine_pb2.EngineGenerateResponse]:
    responses = []
    while (response := await call.read()) is not None:  # type: ignore[attr-defined]
        responses.append(response)
    return responses


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    fake = FakeEngine("engine0")
    await fake.start()
    yield fake
    if fake.hold is not None:
        fake.hold.set()
    await fake.stop()


async def test_requests_share_one_stream_and_read_like_their_own_calls(engine: FakeEngine) -> None:
    engine.tokens = 4
    async with aio.insecure_channel(engine.address) as channel:
        mux = EngineMux(engine_pb2_grpc.EngineStub(channel))
        calls = [mux.generate(_request(f"r{i}")) for i in range(3)]
        results = await asyncio.gather(*(_read_all(call) for call in calls))
        for responses in results:
            tokens = [t for r in responses if r.HasField("chunk") for t in r.chunk.token_ids]
            assert tokens == [100, 101, 102, 103]
            assert responses[-1].HasField("complete")
        assert [r.request_id for r in engine.received] == ["r0", "r1", "r2"]
        assert engine.command_messages == [3]  # started in one turn: one message
        assert mux.carrier.current is not None and not mux.carrier.current.streams  # every request has ended
        await mux.close()


async def test_a_refusal_is_the_requests_status(engine: FakeEngine) -> None:
    engine.fail = grpc.StatusCode.RESOURCE_EXHAUSTED
    async with aio.insecure_channel(engine.address) as channel:
        mux = EngineMux(engine_pb2_grpc.EngineStub(channel))
        with pytest.raises(aio.AioRpcError) as refused:
            await mux.generate(_request("r")).read()
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "fails on purpose" in (refused.value.details() or "")
        engine.fail = None
        assert len(await _read_all(mux.generate(_request("next")))) == 4  # the stream goes on
        await mux.close()


async def test_cancel_aborts_the_request_on_the_engine(engine: FakeEngine) -> None:
    engine.hold = asyncio.Event()  # the stream waits before its last message
    async with aio.insecure_channel(engine.address) as channel:
        mux = EngineMux(engine_pb2_grpc.EngineStub(channel))
        call = mux.generate(_request("r"))
        assert (await call.read()) is not None
        assert call.cancel()
        await eventually(lambda: engine.cancelled == 1, 60.0)
        with pytest.raises(aio.AioRpcError) as cancelled:
            await call.read()
        assert cancelled.value.code() is grpc.StatusCode.CANCELLED
        await mux.close()


async def test_a_broken_stream_fails_its_requests_and_the_next_request_opens_a_new_one(engine: FakeEngine) -> None:
    engine.hold = asyncio.Event()
    async with aio.insecure_channel(engine.address) as channel:
        mux = EngineMux(engine_pb2_grpc.EngineStub(channel))
        calls = [mux.generate(_request(f"r{i}")) for i in range(2)]
        for call in calls:
            assert (await call.read()) is not None
        await engine.stop()  # killed: the stream breaks
        for call in calls:
            with pytest.raises(aio.AioRpcError) as broken:
                while await call.read() is not None:
                    pass
            assert broken.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        engine.hold = None
        await engine.start()  # restarted on the same port
        responses = await asyncio.wait_for(_read_all(mux.generate(_request("after"))), 30)
        assert responses[-1].HasField("complete")
        await mux.close()
