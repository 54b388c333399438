"""Calls the serving side sheds are 503 (retry), never 500; a gRPC server takes a burst of 2000 calls."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import httpx
from grpc import aio

from tests.gateway.conftest import FakeRouter
from turnout.grpc_server import client_channel, make_server
from turnout.v1 import inference_pb2, inference_pb2_grpc


async def test_a_call_the_router_cancelled_is_a_503(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    async def shed(request: object, context: aio.ServicerContext) -> AsyncIterator[inference_pb2.GenerateResponse]:
        await context.abort(grpc.StatusCode.CANCELLED, "CANCELLED")
        yield inference_pb2.GenerateResponse()

    fake_router.script = shed
    reply = await client.post("/v1/completions", json={"prompt": "hi"})
    assert reply.status_code == 503, reply.text


class _Models(inference_pb2_grpc.InferenceServicer):
    async def ListModels(self, request: object, context: aio.ServicerContext) -> inference_pb2.ListModelsResponse:
        await asyncio.sleep(0.001)
        return inference_pb2.ListModelsResponse()


async def test_a_burst_of_2000_calls_is_not_shed_by_grpc_core() -> None:
    server = make_server("test")
    inference_pb2_grpc.add_InferenceServicer_to_server(_Models(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with client_channel(f"127.0.0.1:{port}") as channel:
            stub = inference_pb2_grpc.InferenceStub(channel)

            async def one() -> str:
                try:
                    await stub.ListModels(inference_pb2.ListModelsRequest(), timeout=60)
                except aio.AioRpcError as exc:
                    return exc.code().name
                return "OK"

            outcomes = Counter(await asyncio.gather(*(one() for _ in range(2000))))
    finally:
        await server.stop(0)
    assert outcomes == Counter({"OK": 2000})
