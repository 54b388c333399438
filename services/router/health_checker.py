"""Engine health: the standard gRPC health service, checked on an interval.

Each engine's `HealthState` counts consecutive results: `failure_threshold`
failed checks in a row mark a healthy engine unhealthy, `success_threshold`
passed ones bring it back. A newly added engine is STARTING (never seen up)
and becomes healthy on its first passed check, so a fresh stack serves at once.
A check passes when the engine's server reports SERVING (an engine that is
draining after SIGTERM reports NOT_SERVING) and its model is known; the first
passed check also fetches the model info.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2

from services.router.background import BackgroundLoop
from turnout.v1 import engine_pb2

if TYPE_CHECKING:
    from services.router.engine_pool import EngineClient, EnginePool

log = logging.getLogger(__name__)


class Health(enum.Enum):
    STARTING = "starting"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class HealthState:
    def __init__(self, failure_threshold: int, success_threshold: int) -> None:
        self.failure_threshold = failure_threshold
        self.success_threshold = success_threshold
        self.status = Health.STARTING
        self._passed = 0
        self._failed = 0

    def record(self, passed: bool) -> bool:
        """Count one check; True when the status changed."""
        if passed:
            self._passed, self._failed = self._passed + 1, 0
            recovered = self.status is Health.UNHEALTHY and self._passed >= self.success_threshold
            if self.status is Health.STARTING or recovered:
                self.status = Health.HEALTHY
                return True
        else:
            self._passed, self._failed = 0, self._failed + 1
            if self.status is Health.HEALTHY and self._failed >= self.failure_threshold:
                self.status = Health.UNHEALTHY
                return True
        return False


class HealthChecker(BackgroundLoop):
    """Checks every engine of the pool each interval, and a new engine as soon as it is added."""

    def __init__(self, pool: EnginePool, interval_s: float, timeout_s: float) -> None:
        self._pool = pool
        self._interval = interval_s
        self._timeout = timeout_s

    async def _run(self) -> None:
        while True:
            await asyncio.gather(*(self.check(e) for e in self._pool.engines))
            # Wake up early when engines are added, so they are checked (and used) at once.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._pool.added.wait(), self._interval)
            self._pool.added.clear()

    async def check(self, engine: EngineClient) -> None:
        passed = await self._probe(engine)
        if engine.health.record(passed):
            status = engine.health.status
            (log.warning if status is Health.UNHEALTHY else log.info)(
                "engine health changed", extra={"engine": engine.address, "health": status.value}
            )
            if status is Health.HEALTHY:
                # Back from a restart or an outage: give it traffic again right away.
                engine.breaker.reset()
            else:
                # Down, maybe for a restart that empties its queue and its cache: what the router
                # knew of its load and of the prefixes it holds is stale.
                engine.forget_load()
                self._pool.policy.forget(engine.address)

    async def _probe(self, engine: EngineClient) -> bool:
        try:
            reply = await engine.health_stub.Check(health_pb2.HealthCheckRequest(), timeout=self._timeout)
            if reply.status != health_pb2.HealthCheckResponse.SERVING:
                return False
            if engine.model is None:
                engine.model = await engine.stub.GetModelInfo(engine_pb2.GetModelInfoRequest(), timeout=self._timeout)
                log.info("engine ready", extra={"engine": engine.address, "model": engine.model.name})
        except grpc.RpcError:
            return False
        return True
