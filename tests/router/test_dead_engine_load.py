"""A dead engine's last reported load is neither shown nor routed on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from grpc import aio

from services.router.health_checker import Health
from tests.router.conftest import MODEL, Cluster, eventually
from turnout.v1 import router_admin_pb2

Make = Callable[..., Any]


async def test_an_engine_that_dies_loses_its_reported_load_and_remembered_prefixes(make_cluster: Make) -> None:
    cluster = await make_cluster(2, policy="cache_aware", load_poll_interval_s=0.05, max_retries=0)
    release = asyncio.Event()
    for engine in cluster.engines:
        engine.hold = release
    stream = asyncio.create_task(_open_stream(cluster))
    await eventually(lambda: sum(e.active for e in cluster.engines) == 1, 5)
    victim, survivor = sorted(cluster.engines, key=lambda e: -e.active)
    pool = cluster.runtime.engines
    victim_client = pool.get(victim.address)
    assert victim_client is not None
    # What GetLoad reports includes requests this router did not send (another router's).
    victim.active += 5
    await eventually(lambda: victim_client.reported.running_requests == 6, 5)
    status = (await cluster.statuses())[victim.address]
    assert (status.running_requests, status.load, status.in_flight) == (6, 6, 1)
    assert status.prefix_tree_tokens > 0

    await victim.stop()
    await eventually(lambda: victim_client.health.status is Health.UNHEALTHY, 5)
    await asyncio.wait_for(stream, 5)
    status = (await cluster.statuses())[victim.address]
    assert status.health == router_admin_pb2.EngineStatus.HEALTH_UNHEALTHY
    assert (status.running_requests, status.waiting_requests, status.load, status.in_flight) == (0, 0, 0, 0)
    assert status.prefix_tree_tokens == 0
    assert [e.address for e in pool.routable(MODEL)] == [survivor.address]
    release.set()


async def _open_stream(cluster: Cluster) -> None:
    # It breaks when its engine dies (the router ends it with an abort or an error).
    with contextlib.suppress(aio.AioRpcError):
        await cluster.generate("a prompt the cache-aware policy remembers", max_new_tokens=3)
