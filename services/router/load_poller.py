"""Polls each healthy engine's `GetLoad` in the background.

The reported load (running, waiting, KV usage) is what the engine sees from
every client, this router included; `EngineClient.load` combines it with the
router's own in-flight count, which is exact and instant. A failed poll drops
the last report (the engine may be dead, or restarted empty); marking it
unhealthy is the health checker's business.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc

from services.router.background import BackgroundLoop
from services.router.health_checker import Health
from turnout.v1 import engine_pb2

if TYPE_CHECKING:
    from services.router.engine_pool import EngineClient, EnginePool


class LoadPoller(BackgroundLoop):
    def __init__(self, pool: EnginePool, interval_s: float, timeout_s: float) -> None:
        self._pool = pool
        self._interval = interval_s
        self._timeout = timeout_s

    def start(self) -> None:
        if self._interval > 0:
            super().start()

    async def _run(self) -> None:
        while True:
            healthy = [e for e in self._pool.engines if e.health.status is Health.HEALTHY]
            await asyncio.gather(*(self.poll(e) for e in healthy))
            await asyncio.sleep(self._interval)

    async def poll(self, engine: EngineClient) -> None:
        in_flight = engine.in_flight
        try:
            load = await engine.stub.GetLoad(engine_pb2.GetLoadRequest(), timeout=self._timeout)
        except grpc.RpcError:
            engine.forget_load()
            return
        engine.report_load(load, in_flight)
