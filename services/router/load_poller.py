"""Polls each healthy engine's `GetLoad` in the background.

The reported load (running, waiting, KV usage) is what the engine sees from
every client, this router included; `EngineClient.load` combines it with the
router's own in-flight count, which is exact and instant. A failed poll keeps
the last report: health is the health checker's business.
"""

from __future__ import annotations

import asyncio
import contextlib
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
        with contextlib.suppress(grpc.RpcError):
            engine.report_load(await engine.stub.GetLoad(engine_pb2.GetLoadRequest(), timeout=self._timeout), in_flight)
