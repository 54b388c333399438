"""Generate calls to the router carried by one `Inference.GenerateStream`: the gateway's (every HTTP request)
and `turnout.client.AsyncClient`'s.

Each HTTP request used to make its own Generate call: a call's set-up, and a gRPC message (a write
in the router, a read here, wake-ups at both ends) for every batch of output of every request.
Carried by one stream, what the router has ready for every request comes as one message, and the
requests that start while the gateway works go out as one.

`GenerateCarrier.generate(request, timeout_s)` returns a `CarriedGenerate` that reads like the
Generate call it replaces: `read()` gives each response, then None; a stream that ended with an
error raises that status as an `aio.AioRpcError`; `cancel()` stops it on the router. The deadline is
kept here: when it passes, the stream is cancelled on the router and `read()` raises
DEADLINE_EXCEEDED, as the call's would. So `Generation` reads it as it read calls, and `RouterClient`'s
retry works unchanged (turnout/carrier_client.py has the reading side every carrier shares).

The carrier is opened with the first request and kept. When it breaks (the router died, restarted or
stopped), every stream on it fails with the carrier's status, as their own calls would have, and the
next request opens a new one. Responses are queued per stream without a bound, as the router queues
the engine's: a slow HTTP client's output waits here, not in the router (one reader serves every
stream, so it never waits for one).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from turnout.carried_streams import current_trace_context
from turnout.carrier_client import CarriedCall, OpenCarrier, ResponseStreamsCall
from turnout.v1 import inference_pb2, inference_pb2_grpc

CarriedGenerate = CarriedCall[inference_pb2.GenerateResponse]


class _Session(ResponseStreamsCall[inference_pb2.GenerateStreamRequest, inference_pb2.GenerateResponse]):
    """One open GenerateStream and the streams on it, named by this side's stream ids."""

    def __init__(self, forget: Callable[[_Session], None], stub: inference_pb2_grpc.InferenceStub) -> None:
        super().__init__(
            stub.GenerateStream,
            inference_pb2.GenerateStreamRequest,
            "the router's GenerateStream",
            key_field="stream_id",
            key_of_command=lambda command: command.stream_id,
            on_broken=lambda: forget(self),
        )

    def start(self, stream_id: int, request: inference_pb2.GenerateRequest, timeout_s: float | None) -> CarriedGenerate:
        stream = self.open_stream(stream_id, lambda: self._cancel(stream_id))
        command = self.outgoing.items.add(stream_id=stream_id, trace_context=current_trace_context())
        command.generate.CopyFrom(request)
        self.due()
        stream.set_deadline(timeout_s)
        return stream

    def _cancel(self, stream_id: int) -> None:
        if self.forget(stream_id):
            self.outgoing.items.add(stream_id=stream_id, cancel=True)
            self.due()


class GenerateCarrier:
    """One client's Generate streams to the router, over one GenerateStream at a time."""

    def __init__(self, stub: inference_pb2_grpc.InferenceStub) -> None:
        self.carrier: OpenCarrier[_Session] = OpenCarrier(lambda forget: _Session(forget, stub))
        self._ids = itertools.count(1)

    def generate(self, request: inference_pb2.GenerateRequest, timeout_s: float | None) -> CarriedGenerate:
        """Start `request` on the router (opening the carrier if none is open)."""
        return self.carrier.get().start(next(self._ids), request, timeout_s)

    async def close(self) -> None:
        await self.carrier.close()
