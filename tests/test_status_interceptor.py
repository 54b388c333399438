"""The status interceptor keeps streaming handlers written as coroutines (they answer through
`context.write`, as grpcio's own Health.Watch does) working, instead of failing them INTERNAL."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from turnout.grpc_server import client_channel, make_server


async def test_health_watch_streams_through_the_interceptor() -> None:
    server = make_server("test")
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = client_channel(f"127.0.0.1:{port}")
    try:
        await servicer.set("svc", health_pb2.HealthCheckResponse.SERVING)
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service="svc"))
        first = await asyncio.wait_for(watch.read(), 10)
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        await servicer.set("svc", health_pb2.HealthCheckResponse.NOT_SERVING)
        second = await asyncio.wait_for(watch.read(), 10)
        assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
    finally:
        await channel.close()
        await server.stop(0)
