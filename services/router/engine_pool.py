"""The engines the router sends work to: their channels, health, load and counters.

Engines come and go at run time (static addresses, DNS names re-resolved on an
interval, the RouterAdmin service); `engines` is in the order they were added,
and policies break ties by that order. An engine is *routable* when its model
is known, it is healthy and its circuit breaker lets requests through.

Load is the router's own count of streams in flight on each engine, held for
the whole life of every stream (`EngineClient.track`), plus whatever the
engine reported in its last `GetLoad` beyond what this router had sent it
(other routers' requests, clients calling the engine directly). A report is
dropped as soon as a poll fails or the engine is marked unhealthy: a dead
engine's last load is never routed on nor shown.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Iterator

from grpc_health.v1 import health_pb2_grpc

from services.router.admission import Admission
from services.router.circuit_breaker import CircuitBreaker
from services.router.config import RouterConfig
from services.router.engine_mux import EngineMux
from services.router.health_checker import Health, HealthState
from services.router.policies import Policy, make_policy
from turnout.errors import NotFound, Unavailable
from turnout.grpc_server import client_channel
from turnout.v1 import common_pb2, engine_pb2, engine_pb2_grpc

log = logging.getLogger(__name__)

# Channels of removed engines being closed once their last stream ended (held so the tasks are not collected).
_closing: set[asyncio.Task[None]] = set()


class EngineClient:
    def __init__(self, address: str, target: str, config: RouterConfig) -> None:
        self.address = address
        self.target = target
        self.channel = client_channel(address, config.security.client)
        self.stub = engine_pb2_grpc.EngineStub(self.channel)
        # Generate requests go over one stream per engine (engine_mux.py).
        self.mux = EngineMux(self.stub)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.model: common_pb2.ModelInfo | None = None
        self.health = HealthState(config.health_failure_threshold, config.health_success_threshold)
        self.breaker = CircuitBreaker(config.circuit_breaker_failures, config.circuit_breaker_cooldown_s)
        self.in_flight = 0
        self.reported = engine_pb2.Load()
        # Requests the engine reported that this router did not send (as of the last report).
        self._external = 0
        self.requests_total = 0
        self.failures_total = 0
        self.retried_total = 0
        self.removed = False

    @property
    def routable(self) -> bool:
        return (
            not self.removed
            and self.model is not None
            and self.health.status is Health.HEALTHY
            and self.breaker.allows()
        )

    @property
    def load(self) -> int:
        return self.in_flight + self._external

    def report_load(self, load: engine_pb2.Load, in_flight: int) -> None:
        """Take a GetLoad reply; `in_flight` is this router's count when the poll was sent."""
        self.reported = load
        self._external = max(0, load.running_requests + load.waiting_requests - in_flight)

    def forget_load(self) -> None:
        """Drop the last GetLoad reply: the engine is unreachable, so it says nothing of the engine now
        (a restarted one starts empty). The router's own in-flight count stays: it is exact."""
        self.reported = engine_pb2.Load()
        self._external = 0

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Count one stream as in flight until the block exits (completion, error or cancellation)."""
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1
            if self.removed and self.in_flight == 0:
                task = asyncio.get_running_loop().create_task(self.channel.close())
                _closing.add(task)
                task.add_done_callback(_closing.discard)


class EnginePool:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.engines: list[EngineClient] = []
        self.policy: Policy = make_policy(config)
        self.admission = Admission(config.max_concurrent_requests, config.max_queued_requests, config.queue_timeout_s)
        # Set when an engine is added, so the health checker looks at it at once.
        self.added = asyncio.Event()
        # (policy reason) -> requests routed for that reason, for metrics.
        self.decisions: collections.Counter[str] = collections.Counter()
        # Requests refused because no engine was routable (admission counts its own refusals).
        self.rejections: collections.Counter[str] = collections.Counter()

    def get(self, address: str) -> EngineClient | None:
        return next((e for e in self.engines if e.address == address), None)

    def add(self, address: str, target: str) -> EngineClient | None:
        """Start routing to `address` (once it is healthy); None when it is already there."""
        if self.get(address) is not None:
            return None
        engine = EngineClient(address, target, self.config)
        self.engines.append(engine)
        self.added.set()
        log.info("engine added", extra={"engine": address, "target": target})
        return engine

    async def remove(self, address: str) -> None:
        """Stop routing to `address`; streams already running there finish first."""
        engine = self.get(address)
        if engine is None:
            return
        self.engines.remove(engine)
        engine.removed = True
        self.policy.forget(address)
        log.info("engine removed", extra={"engine": address, "in_flight": engine.in_flight})
        if engine.in_flight == 0:
            await engine.channel.close()

    async def close(self) -> None:
        await asyncio.gather(*(e.channel.close() for e in self.engines))

    def routable(self, model_name: str, lora_name: str = "") -> list[EngineClient]:
        """Engines that can take a request for the model, and for its LoRA adapter when it names one:
        those that have the adapter loaded, or, when none has, every engine of the model (each
        then refuses it with its own clear error)."""
        engines = [e for e in self.engines if e.routable and e.model is not None and e.model.name == model_name]
        if lora_name:
            having = [e for e in engines if e.model is not None and has_adapter(e.model, lora_name)]
            return having or engines
        return engines

    def models(self) -> list[common_pb2.ModelInfo]:
        """One ModelInfo per model that a healthy engine serves, in engine order, each followed by its
        LoRA adapters (ModelInfo.parent: the model's name)."""
        seen: dict[str, common_pb2.ModelInfo] = {}
        adapters: dict[str, common_pb2.ModelInfo] = {}
        for engine in self.engines:
            if engine.model is not None and engine.health.status is Health.HEALTHY:
                seen.setdefault(engine.model.name, engine.model)
                for adapter in engine.model.lora_adapters:
                    entry = common_pb2.ModelInfo()
                    entry.CopyFrom(engine.model)
                    del entry.lora_adapters[:]
                    entry.name, entry.path, entry.parent = adapter.name, adapter.path, engine.model.name
                    adapters.setdefault(adapter.name, entry)
        listed: list[common_pb2.ModelInfo] = []
        for name, info in seen.items():
            listed += [info, *(entry for entry in adapters.values() if entry.parent == name)]
        return listed

    def resolve_model(self, name: str) -> tuple[common_pb2.ModelInfo, str]:
        """(the model, the LoRA adapter) a request's `model` names: a served model and no adapter, or a
        loaded adapter's name and the model it adapts (vLLM: `model` may name an adapter)."""
        try:
            return self.model_info(name), ""
        except NotFound:
            for engine in sorted(self.engines, key=lambda e: e.health.status is not Health.HEALTHY):
                if engine.model is not None and any(a.name == name for a in engine.model.lora_adapters):
                    return engine.model, name
            raise

    def model_info(self, name: str) -> common_pb2.ModelInfo:
        """The named model (the default one when the name is empty); NotFound or Unavailable otherwise.

        Models of engines that are down right now still count as served: a request
        for one is UNAVAILABLE (try again later), not NOT_FOUND.
        """
        known: dict[str, common_pb2.ModelInfo] = {}
        for engine in sorted(self.engines, key=lambda e: e.health.status is not Health.HEALTHY):
            if engine.model is not None:
                known.setdefault(engine.model.name, engine.model)
        if not known:
            raise Unavailable("no engine is ready yet")
        if not name:
            return next(iter(known.values()))
        if name in known:
            return known[name]
        adapters = sorted({a.name for e in self.engines if e.model is not None for a in e.model.lora_adapters})
        also = f"; LoRA adapters: {', '.join(adapters)}" if adapters else ""
        raise NotFound(f"model {name!r} does not exist; served models: {', '.join(known)}{also}")


def has_adapter(model: common_pb2.ModelInfo, lora_name: str) -> bool:
    """Whether the engine's model info lists the adapter, by name or by the path it was loaded from."""
    return any(lora_name in (adapter.name, adapter.path) for adapter in model.lora_adapters)
