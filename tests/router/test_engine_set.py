"""Engines joining and leaving a running router: DNS names, the RouterAdmin service, metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from grpc import aio
from prometheus_client import generate_latest

from services.router.metrics import make_registry
from tests.router.conftest import Cluster, eventually, text_of
from turnout.v1 import router_admin_pb2

Make = Callable[..., Any]


class FakeDns:
    """A resolver whose answer the test changes, like replicas being scaled."""

    def __init__(self) -> None:
        self.answer: list[str] = []
        self.fail = False
        self.lookups = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups += 1
        assert host == "engine"
        if self.fail:
            raise OSError("temporary failure in name resolution")
        return list(self.answer)


def addresses(cluster: Cluster) -> list[str]:
    return sorted(e.address for e in cluster.runtime.engines.engines)


async def test_a_dns_name_stands_for_every_address_and_follows_scaling(make_cluster: Make) -> None:
    dns = FakeDns()
    cluster = await make_cluster(3, wait=False, targets=("engine:50051",), resolver=dns, dns_refresh_interval_s=0.05)
    a, b, c = (e.address for e in cluster.engines)
    dns.answer = [a, b]
    await eventually(lambda: addresses(cluster) == sorted([a, b]))
    await cluster.wait_routable(2)
    dns.answer = [a, b, c]  # scaled up
    await eventually(lambda: addresses(cluster) == sorted([a, b, c]))
    await cluster.wait_routable(3)
    for i in range(6):
        await cluster.generate(f"p{i}")
    assert min(cluster.by_engine()) >= 1
    dns.fail = True  # a DNS hiccup keeps what we had
    lookups = dns.lookups
    await eventually(lambda: dns.lookups > lookups + 2)
    assert addresses(cluster) == sorted([a, b, c])
    dns.fail = False
    dns.answer = [c]  # scaled down
    await eventually(lambda: addresses(cluster) == [c])
    reply = await cluster.admin.ListEngines(router_admin_pb2.ListEnginesRequest())
    assert list(reply.targets) == ["engine:50051"] and [s.target for s in reply.engines] == ["engine:50051"]


async def test_admin_adds_and_removes_engines_while_running(make_cluster: Make) -> None:
    cluster = await make_cluster(2, wait=False, targets=())
    first, second = cluster.engines
    assert (await cluster.admin.AddEngine(router_admin_pb2.AddEngineRequest(address=first.address))).added
    assert not (await cluster.admin.AddEngine(router_admin_pb2.AddEngineRequest(address=first.address))).added
    await cluster.wait_routable(1)
    await cluster.admin.AddEngine(router_admin_pb2.AddEngineRequest(address=second.address))
    await cluster.wait_routable(2)

    first.hold = asyncio.Event()
    running = asyncio.create_task(cluster.generate("long one"))
    await eventually(lambda: len(first.received) == 1)
    await cluster.admin.RemoveEngine(router_admin_pb2.RemoveEngineRequest(address=first.address))
    for i in range(3):
        await cluster.generate(f"p{i}")
    assert len(first.received) == 1 and len(second.received) == 3
    first.hold.set()
    assert text_of(await running) == "<100><101><102>"  # the stream on the removed engine finished

    for bad, code in (("nonsense", grpc.StatusCode.INVALID_ARGUMENT), ("10.9.9.9:1", grpc.StatusCode.NOT_FOUND)):
        call = (
            cluster.admin.AddEngine(router_admin_pb2.AddEngineRequest(address=bad))
            if code is grpc.StatusCode.INVALID_ARGUMENT
            else cluster.admin.RemoveEngine(router_admin_pb2.RemoveEngineRequest(address=bad))
        )
        with pytest.raises(aio.AioRpcError) as caught:
            await call
        assert caught.value.code() is code


async def test_list_engines_and_metrics_show_the_counters(make_cluster: Make) -> None:
    cluster = await make_cluster(2, policy="round_robin")
    for i in range(4):
        await cluster.generate(f"p{i}")
    reply = await cluster.admin.ListEngines(router_admin_pb2.ListEnginesRequest())
    assert reply.policy == "round_robin"
    for status in reply.engines:
        assert status.model == "fake-model" and status.routable
        assert status.health == router_admin_pb2.EngineStatus.HEALTH_HEALTHY
        assert status.circuit == router_admin_pb2.EngineStatus.CIRCUIT_CLOSED
        assert (status.requests_total, status.in_flight) == (2, 0)
    text = generate_latest(make_registry(cluster.runtime.engines)).decode()
    address = cluster.engines[0].address
    assert f'turnout_router_engine_requests_total{{engine="{address}"}} 2.0' in text
    assert f'turnout_router_engine_healthy{{engine="{address}"}} 1.0' in text
    assert 'turnout_router_routing_decisions_total{policy="round_robin",reason="round_robin"} 4.0' in text
    assert "turnout_router_engine_in_flight" in text and "turnout_router_queued_requests 0.0" in text
