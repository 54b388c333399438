"""The RouterAdmin gRPC servicer: the engines' state, and adding or removing engines at run time."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from grpc import aio

from services.router.circuit_breaker import Circuit
from services.router.engine_discovery import EngineDiscovery
from services.router.engine_pool import EngineClient, EnginePool
from services.router.health_checker import Health
from turnout.errors import Unavailable
from turnout.grpc_auth import forwarded
from turnout.v1 import engine_pb2, router_admin_pb2, router_admin_pb2_grpc

# A flush is one quick command on each engine's step loop; past this the engine is reported as not flushed.
FLUSH_TIMEOUT_S = 10.0
# Loading an adapter reads its weights on the engine's step loop: seconds for large ones.
LORA_TIMEOUT_S = 60.0

_HEALTH = {
    Health.STARTING: router_admin_pb2.EngineStatus.HEALTH_STARTING,
    Health.HEALTHY: router_admin_pb2.EngineStatus.HEALTH_HEALTHY,
    Health.UNHEALTHY: router_admin_pb2.EngineStatus.HEALTH_UNHEALTHY,
}
_CIRCUIT = {
    Circuit.CLOSED: router_admin_pb2.EngineStatus.CIRCUIT_CLOSED,
    Circuit.OPEN: router_admin_pb2.EngineStatus.CIRCUIT_OPEN,
    Circuit.HALF_OPEN: router_admin_pb2.EngineStatus.CIRCUIT_HALF_OPEN,
}


def engine_status(engine: EngineClient, pool: EnginePool) -> router_admin_pb2.EngineStatus:
    return router_admin_pb2.EngineStatus(
        address=engine.address,
        target=engine.target,
        model=engine.model.name if engine.model is not None else "",
        health=_HEALTH[engine.health.status],
        circuit=_CIRCUIT[engine.breaker.state],
        routable=engine.routable,
        in_flight=engine.in_flight,
        running_requests=engine.reported.running_requests,
        waiting_requests=engine.reported.waiting_requests,
        kv_cache_usage=engine.reported.kv_cache_usage,
        kv_cache_capacity_tokens=engine.reported.kv_cache_capacity_tokens,
        load=engine.load,
        requests_total=engine.requests_total,
        failures_total=engine.failures_total,
        retried_total=engine.retried_total,
        prefix_tree_tokens=pool.policy.remembered_tokens(engine.address),
    )


class RouterAdminServicer(router_admin_pb2_grpc.RouterAdminServicer):
    def __init__(self, pool: EnginePool, discovery: EngineDiscovery) -> None:
        self._pool = pool
        self._discovery = discovery

    async def ListEngines(
        self, request: router_admin_pb2.ListEnginesRequest, context: aio.ServicerContext
    ) -> router_admin_pb2.ListEnginesResponse:
        return router_admin_pb2.ListEnginesResponse(
            policy=self._pool.policy.name,
            engines=[engine_status(e, self._pool) for e in self._pool.engines],
            targets=self._discovery.targets,
            active_requests=self._pool.admission.active,
            queued_requests=self._pool.admission.queued,
        )

    async def AddEngine(
        self, request: router_admin_pb2.AddEngineRequest, context: aio.ServicerContext
    ) -> router_admin_pb2.AddEngineResponse:
        return router_admin_pb2.AddEngineResponse(added=await self._discovery.add(request.address))

    async def RemoveEngine(
        self, request: router_admin_pb2.RemoveEngineRequest, context: aio.ServicerContext
    ) -> router_admin_pb2.RemoveEngineResponse:
        await self._discovery.remove(request.address)
        return router_admin_pb2.RemoveEngineResponse()

    async def FlushCache(
        self, request: engine_pb2.FlushCacheRequest, context: aio.ServicerContext
    ) -> router_admin_pb2.FlushAllCachesResponse:
        engines = list(self._pool.engines)
        # Each engine checks the caller's admin key itself: the router's own token cannot flush.
        caller = forwarded(context)
        results = await asyncio.gather(*(self._flush(engine, caller) for engine in engines))
        return router_admin_pb2.FlushAllCachesResponse(engines=results)

    async def LoadLoraAdapter(
        self, request: engine_pb2.LoadLoraAdapterRequest, context: aio.ServicerContext
    ) -> engine_pb2.LoadLoraAdapterResponse:
        await self._on_every_engine(
            context,
            lambda engine, caller: engine.stub.LoadLoraAdapter(request, timeout=LORA_TIMEOUT_S, metadata=caller),
        )
        return engine_pb2.LoadLoraAdapterResponse()

    async def UnloadLoraAdapter(
        self, request: engine_pb2.UnloadLoraAdapterRequest, context: aio.ServicerContext
    ) -> engine_pb2.UnloadLoraAdapterResponse:
        await self._on_every_engine(
            context,
            lambda engine, caller: engine.stub.UnloadLoraAdapter(request, timeout=LORA_TIMEOUT_S, metadata=caller),
        )
        return engine_pb2.UnloadLoraAdapterResponse()

    async def _on_every_engine(
        self,
        context: aio.ServicerContext,
        call: Callable[[EngineClient, tuple[tuple[str, str], ...]], Awaitable[object]],
    ) -> None:
        """call() on every known engine at once, as the caller (each engine checks the admin key itself);
        then each engine's model info is read again (its adapters changed). The first refusal becomes
        this call's error, naming the engine; engines where it worked keep the change."""
        engines = list(self._pool.engines)
        if not engines:
            raise Unavailable("no engine is known")
        caller = forwarded(context)
        results = await asyncio.gather(*(call(engine, caller) for engine in engines), return_exceptions=True)
        for engine in engines:
            with contextlib.suppress(aio.AioRpcError):
                engine.model = await engine.stub.GetModelInfo(engine_pb2.GetModelInfoRequest(), timeout=LORA_TIMEOUT_S)
        for engine, result in zip(engines, results, strict=True):
            if isinstance(result, aio.AioRpcError):
                await context.abort(result.code(), f"engine {engine.address}: {result.details()}")
            if isinstance(result, BaseException):
                raise result

    async def _flush(
        self, engine: EngineClient, caller: tuple[tuple[str, str], ...]
    ) -> router_admin_pb2.EngineFlushResult:
        result = router_admin_pb2.EngineFlushResult(address=engine.address)
        try:
            reply = await engine.stub.FlushCache(
                engine_pb2.FlushCacheRequest(), timeout=FLUSH_TIMEOUT_S, metadata=caller
            )
        except aio.AioRpcError as exc:
            result.message = f"{exc.code().name}: {exc.details()}"
            return result
        result.flushed, result.message = reply.flushed, reply.message
        if reply.flushed:
            # What the cache-aware policy remembers of this engine's cache is gone with it.
            self._pool.policy.forget(engine.address)
        return result
