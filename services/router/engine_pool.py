"""The engines the router sends work to, what model each serves, and its in-flight count.

Round-robin over engines whose model info is known. The in-flight count is held
for the whole life of every stream (see `EngineClient.track`), so load-aware
policies have real numbers to work with.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Iterator

import grpc

from turnout.errors import NotFound, Unavailable
from turnout.grpc_server import insecure_channel
from turnout.v1 import common_pb2, engine_pb2, engine_pb2_grpc

log = logging.getLogger(__name__)


class EngineClient:
    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = insecure_channel(address)
        self.stub = engine_pb2_grpc.EngineStub(self.channel)
        self.model: common_pb2.ModelInfo | None = None
        self.in_flight = 0

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1


class EnginePool:
    def __init__(self, addresses: tuple[str, ...], discovery_interval_s: float = 1.0) -> None:
        self.engines = [EngineClient(a) for a in addresses]
        self._interval = discovery_interval_s
        self._turn = itertools.count()
        self._discovery: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._discovery = [asyncio.create_task(self._discover(e)) for e in self.engines]

    async def close(self) -> None:
        for task in self._discovery:
            task.cancel()
        await asyncio.gather(*self._discovery, return_exceptions=True)
        await asyncio.gather(*(e.channel.close() for e in self.engines))

    async def _discover(self, engine: EngineClient) -> None:
        """Learn which model an engine serves, retrying until it answers."""
        while engine.model is None:
            try:
                engine.model = await engine.stub.GetModelInfo(engine_pb2.GetModelInfoRequest(), timeout=5.0)
                log.info("engine ready", extra={"engine": engine.address, "model": engine.model.name})
            except grpc.RpcError:
                await asyncio.sleep(self._interval)

    def models(self) -> list[common_pb2.ModelInfo]:
        """One ModelInfo per served name, in engine order."""
        seen: dict[str, common_pb2.ModelInfo] = {}
        for engine in self.engines:
            if engine.model is not None:
                seen.setdefault(engine.model.name, engine.model)
        return list(seen.values())

    def model_info(self, name: str) -> common_pb2.ModelInfo:
        """The named model (any, when the name is empty); NotFound or Unavailable otherwise."""
        models = self.models()
        if not models:
            raise Unavailable("no engine is ready yet")
        if not name:
            return models[0]
        for model in models:
            if model.name == name:
                return model
        served = ", ".join(m.name for m in models)
        raise NotFound(f"model {name!r} does not exist; served models: {served}")

    def pick(self, model_name: str) -> EngineClient:
        candidates = [e for e in self.engines if e.model is not None and e.model.name == model_name]
        if not candidates:
            raise Unavailable(f"no engine is serving {model_name!r}")
        return candidates[next(self._turn) % len(candidates)]
