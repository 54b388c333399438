"""Callers wait a bounded time for a service that is restarting, then fail with a clear error."""

from __future__ import annotations

import asyncio
import time

import pytest
from grpc import aio
from grpc_health.v1 import health, health_pb2_grpc

from gateway.errors import HTTPError
from gateway.router_client import RouterClient
from services.router.tokenizer_pool import TokenizerPool
from turnout.child_processes import free_port
from turnout.errors import Unavailable
from turnout.grpc_server import client_channel
from turnout.v1 import inference_pb2


async def start_server(port: int) -> aio.Server:
    server = aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


async def start_later(port: int, delay_s: float) -> aio.Server:
    await asyncio.sleep(delay_s)
    return await start_server(port)


async def test_tokenizer_pool_waits_for_a_restarting_tokenizer_then_names_it() -> None:
    port = free_port()
    pool = TokenizerPool((f"127.0.0.1:{port}",), ready_timeout_s=0.5)
    try:
        started = time.monotonic()
        with pytest.raises(Unavailable, match=rf"no tokenizer is reachable \(127.0.0.1:{port}; restarting\?\)"):
            await pool.pick()
        assert time.monotonic() - started >= 0.45
        pool = TokenizerPool((f"127.0.0.1:{port}",), ready_timeout_s=30)
        later = asyncio.create_task(start_later(port, 0.5))
        await pool.pick()  # comes back within the wait
        server = await later
        await server.stop(0)
    finally:
        await pool.close()


async def test_tokenizer_pool_skips_a_replica_that_is_down() -> None:
    up, down = free_port(), free_port()
    server = await start_server(up)
    pool = TokenizerPool((f"127.0.0.1:{down}", f"127.0.0.1:{up}"), ready_timeout_s=5)
    try:
        picked = [await pool.pick() for _ in range(4)]
        assert all(stub is picked[0] for stub in picked)
        assert picked[0] is pool._stubs[1]
    finally:
        await pool.close()
        await server.stop(0)


async def test_gateway_waits_for_a_restarting_router_then_answers_503_naming_it() -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    channel = client_channel(address)
    client = RouterClient.on_channel(channel, None, address=address, ready_timeout_s=0.5)
    try:
        with pytest.raises(HTTPError) as refused:
            await client.generate([inference_pb2.GenerateRequest()])
        assert refused.value.status == 503
        assert refused.value.message.startswith(f"the router at {address} is not reachable (restarting?)")
        patient = RouterClient.on_channel(channel, None, address=address, ready_timeout_s=30)
        later = asyncio.create_task(start_later(port, 0.5))
        await patient.connected()
        server = await later
        await server.stop(0)
        # A probe never waits: the call goes ahead and fails at once.
        started = time.monotonic()
        with pytest.raises(aio.AioRpcError):
            await patient.probing().list_models(timeout_s=5)
        assert time.monotonic() - started < 4
    finally:
        await channel.close()
