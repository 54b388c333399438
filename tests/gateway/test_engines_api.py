"""`GET /v1/engines` shows the router's RouterAdmin.ListEngines as JSON."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from grpc import aio

from gateway.config import GatewayConfig
from turnout.v1 import router_admin_pb2, router_admin_pb2_grpc

Status = router_admin_pb2.EngineStatus


class FakeAdmin(router_admin_pb2_grpc.RouterAdminServicer):
    async def ListEngines(self, request: Any, context: Any) -> Any:
        return router_admin_pb2.ListEnginesResponse(
            policy="cache_aware",
            targets=["engine:50051"],
            active_requests=3,
            engines=[
                Status(
                    address="10.0.0.5:50051",
                    target="engine:50051",
                    model="tiny",
                    health=Status.HEALTH_HEALTHY,
                    circuit=Status.CIRCUIT_CLOSED,
                    routable=True,
                    in_flight=3,
                    load=4,
                    running_requests=4,
                    kv_cache_usage=0.25,
                    requests_total=10,
                    retried_total=1,
                    prefix_tree_tokens=900,
                    kv_cache_capacity_tokens=4096,
                ),
                Status(address="10.0.0.6:50051", target="engine:50051", health=Status.HEALTH_UNHEALTHY,
                       circuit=Status.CIRCUIT_OPEN),
            ],
        )  # fmt: skip


@pytest.fixture
async def admin_address() -> AsyncIterator[str]:
    server = aio.server()
    router_admin_pb2_grpc.add_RouterAdminServicer_to_server(FakeAdmin(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(0)


async def test_engines_route_shows_health_load_and_counters(
    admin_address: str, make_client: Callable[[GatewayConfig], AsyncIterator[httpx.AsyncClient]]
) -> None:
    async for client in make_client(GatewayConfig(router_address=admin_address)):
        reply = await client.get("/v1/engines")
    assert reply.status_code == 200
    body = reply.json()
    assert (body["policy"], body["targets"], body["active_requests"]) == ("cache_aware", ["engine:50051"], 3)
    first, second = body["data"]
    assert first == {
        "address": "10.0.0.5:50051",
        "target": "engine:50051",
        "model": "tiny",
        "health": "healthy",
        "circuit": "closed",
        "routable": True,
        "in_flight": 3,
        "load": 4,
        "running_requests": 4,
        "waiting_requests": 0,
        "kv_cache_usage": 0.25,
        "requests_total": 10,
        "failures_total": 0,
        "retried_total": 1,
        "prefix_tree_tokens": 900,
        "kv_cache_capacity_tokens": 4096,
    }
    assert (second["health"], second["circuit"], second["model"]) == ("unhealthy", "open", None)


async def test_engines_route_without_a_router_admin_is_an_error_body(
    make_client: Callable[[GatewayConfig], AsyncIterator[httpx.AsyncClient]],
) -> None:
    server = aio.server()  # serves nothing: UNIMPLEMENTED
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async for client in make_client(GatewayConfig(router_address=f"127.0.0.1:{port}")):
            reply = await client.get("/v1/engines")
    finally:
        await server.stop(0)
    assert reply.status_code == 501 and reply.json()["error"]["message"]
