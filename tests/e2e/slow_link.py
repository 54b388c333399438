"""A slow engine for routing tests: a real engine behind a proxy that delays every chunk.

On two CPU cores a tiny engine limited to one running request is barely slower than
its batching siblings (the vocabulary projection costs the same per row either way),
so the "slow engine" is made honest and unmistakable the way a slower accelerator or
a congested link would be: the proxy forwards every call to a real engine and holds
each streamed engine step for `delay_s`. Health checks, load, model info and aborts are
forwarded as they are; cancelling a proxied stream cancels the engine's.

It runs a grpc.aio server on its own thread and event loop, so it outlives the
per-test event loops of pytest-asyncio.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

from grpc import aio
from grpc_health.v1 import health_pb2_grpc

from services.engine.generate_stream import GenerateStreams
from tests.credentials import INTERNAL
from turnout.child_processes import free_port
from turnout.grpc_server import client_channel
from turnout.v1 import engine_pb2, engine_pb2_grpc


class _Proxy(engine_pb2_grpc.EngineServicer, health_pb2_grpc.HealthServicer):
    def __init__(self, upstream: str, delay_s: float) -> None:
        self._upstream = upstream
        self._delay_s = delay_s
        self._channel: aio.Channel | None = None
        self._streams = GenerateStreams(self._generate)

    def _engine(self) -> engine_pb2_grpc.EngineStub:
        if self._channel is None:
            self._channel = client_channel(self._upstream, INTERNAL)
        return engine_pb2_grpc.EngineStub(self._channel)

    async def Generate(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for response in self._generate(request):
            yield response

    async def GenerateStream(self, commands: Any, context: Any) -> AsyncIterator[Any]:
        # The router's path: each request of the stream proxied as its own Generate call.
        async for outputs in self._streams.serve(commands):
            yield outputs

    async def _generate(self, request: Any) -> AsyncIterator[Any]:
        call = self._engine().Generate(request)
        try:
            async for response in call:
                # One step at a time, each held: the engine sends the steps that were ready together in
                # one message (`batch`), and while this proxy holds a message the next one gathers every
                # step the engine made meanwhile, so holding messages would let a request through in
                # a few delays. Each step is what a message of its own would have been (engine.proto).
                first = engine_pb2.EngineGenerateResponse()
                first.CopyFrom(response)
                first.ClearField("batch")
                for step in (first, *response.batch):
                    await asyncio.sleep(self._delay_s)
                    yield step
        finally:
            call.cancel()

    async def Abort(self, request: Any, context: Any) -> Any:
        return await self._engine().Abort(request)

    async def GetModelInfo(self, request: Any, context: Any) -> Any:
        return await self._engine().GetModelInfo(request)

    async def GetLoad(self, request: Any, context: Any) -> Any:
        return await self._engine().GetLoad(request)

    async def Check(self, request: Any, context: Any) -> Any:
        self._engine()  # opens the channel
        assert self._channel is not None
        return await health_pb2_grpc.HealthStub(self._channel).Check(request, timeout=2)


class SlowLink:
    def __init__(self, upstream: str, delay_s: float) -> None:
        self.port = free_port()
        self._proxy = _Proxy(upstream, delay_s)
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="slow-link", daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> SlowLink:
        self._thread.start()
        self._started.wait(10)
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        server = aio.server()
        engine_pb2_grpc.add_EngineServicer_to_server(self._proxy, server)
        health_pb2_grpc.add_HealthServicer_to_server(self._proxy, server)
        server.add_insecure_port(self.address)
        await server.start()
        self._stop = asyncio.Event()
        self._started.set()
        await self._stop.wait()
        await server.stop(0)
