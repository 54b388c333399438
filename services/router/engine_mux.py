"""The router's requests to one engine, over one `Engine.GenerateStream`.

Each request used to be its own Generate call: a call's set-up, and one message (a write, a read,
wake-ups at both ends) per engine step per request. Over one stream per engine, an engine step's
outputs for every request arrive as one message, read once and handed to each request's queue.

`EngineMux.generate(request)` returns a `MuxedCall` that reads like the Generate call it replaces
(`read()` gives each `EngineGenerateResponse`, then `aio.EOF`; a request that ended with an error
raises that status as an `aio.AioRpcError`; `cancel()` aborts the request on the engine), so
dispatch's retries, failover and accounting apply unchanged. `ready()` adds what a call cannot
give: every response that arrived while the request's reader was busy, at once. The requests
(and aborts) that become due in the same turn go to the engine as one message.

The stream is opened on the first request and kept; when it breaks (the engine died, restarted or
stopped), every request on it fails with the stream's status, as their own calls would have, and the
next request opens a new one.
"""

from __future__ import annotations

from collections.abc import Callable

from turnout.carrier_client import CarriedCall, OpenCarrier, ResponseStreamsCall
from turnout.v1 import engine_pb2, engine_pb2_grpc

MuxedCall = CarriedCall[engine_pb2.EngineGenerateResponse]


class _Session(ResponseStreamsCall[engine_pb2.EngineStreamCommands, engine_pb2.EngineGenerateResponse]):
    """One open GenerateStream and the requests on it, named by their request ids."""

    def __init__(self, forget: Callable[[_Session], None], stub: engine_pb2_grpc.EngineStub) -> None:
        super().__init__(
            stub.GenerateStream,
            engine_pb2.EngineStreamCommands,
            "the engine's GenerateStream",
            key_field="request_id",
            key_of_command=lambda command: command.generate.request_id,
            on_broken=lambda: forget(self),
        )

    def start(self, request: engine_pb2.EngineGenerateRequest) -> MuxedCall:
        request_id = request.request_id
        call = self.open_stream(request_id, lambda: self._abort(request_id))
        self.outgoing.items.add().generate.CopyFrom(request)
        self.due()
        return call

    def _abort(self, request_id: str) -> None:
        if self.forget(request_id):
            self.outgoing.items.add().abort.request_id = request_id
            self.due()


class EngineMux:
    """The requests this router sends to one engine, over one GenerateStream at a time."""

    def __init__(self, stub: engine_pb2_grpc.EngineStub) -> None:
        self.carrier: OpenCarrier[_Session] = OpenCarrier(lambda forget: _Session(forget, stub))

    def generate(self, request: engine_pb2.EngineGenerateRequest) -> MuxedCall:
        """Start `request` on the engine (opening the stream if none is open)."""
        return self.carrier.get().start(request)

    async def close(self) -> None:
        await self.carrier.close()
