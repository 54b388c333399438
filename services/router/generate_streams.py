"""Inference.GenerateStream: many Generate calls over one stream (the gateway keeps one open).

Each Generate call costs a call's set-up, and a message with its own write, read and wake-ups at
both ends for every batch of every request. Carried by one stream per caller, what became ready for
all of its requests since the last write goes out as one message.

Each carried stream runs the servicer's own Generate handler, so it is answered exactly as its call
would be (the same responses, in the same order), then ends with the status that call would have
ended with. A `cancel` command, or the carrier closing, stops it the way a cancelled call stops.
While the router drains (`drain()`), new streams are refused UNAVAILABLE (the gateway tries another
time) and the carrier ends once its streams have. The caller keeps its own deadline per stream: it
cancels the stream when the deadline passes.

A stream's trace context comes in its command (`trace_context`), not in the carrier's metadata: its
SERVER span is opened here, named as the Generate call's would be.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc import aio

from turnout.carried_streams import CarrierServer, ResponseStreams, call_error
from turnout.errors import InvalidArgument
from turnout.v1 import inference_pb2

Handler = Callable[[inference_pb2.GenerateRequest, Any], AsyncIterator[inference_pb2.GenerateResponse]]

# Each carried stream is traced and reported as its own Generate call would be.
_METHOD = "turnout.v1.Inference/Generate"


class GenerateStreams(CarrierServer):
    """Serves GenerateStream calls with a servicer's `Generate` handler."""

    def __init__(self, generate: Handler, service: str = "router") -> None:
        super().__init__()
        self._generate = generate
        self._service = service

    async def serve(
        self, requests: AsyncIterator[inference_pb2.GenerateStreamRequest], context: aio.ServicerContext | None
    ) -> AsyncIterator[inference_pb2.GenerateStreamResponse]:
        async for message in self._serve(_Carrier(self, _CarriedContext(context)), requests):
            yield message


class _CarriedContext:
    """What a Generate handler may ask of its call's context, for a carried stream: `abort` ends the
    stream (not the carrier) with that status; the metadata and peer are the carrier call's."""

    def __init__(self, carrier: aio.ServicerContext | None) -> None:
        self._carrier = carrier

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise call_error(code, details)

    def invocation_metadata(self) -> Any:
        return self._carrier.invocation_metadata() if self._carrier is not None else ()

    def peer(self) -> str:
        return self._carrier.peer() if self._carrier is not None else ""


class _Carrier(ResponseStreams[inference_pb2.GenerateStreamRequest, inference_pb2.GenerateStreamResponse]):
    """One GenerateStream call: its carried streams, named by the caller's stream ids."""

    def __init__(self, owner: GenerateStreams, context: _CarriedContext) -> None:
        super().__init__(
            owner,
            inference_pb2.GenerateStreamResponse,
            service=owner._service,
            method=_METHOD,
            key_field="stream_id",
            key_name="stream id",
        )
        self._handler = owner._generate
        self._context = context

    async def read(self, requests: AsyncIterator[inference_pb2.GenerateStreamRequest]) -> None:
        async for message in requests:
            for command in message.items:
                kind = command.WhichOneof("kind")
                if kind == "generate":
                    self.start(command.stream_id, self._responses(command.generate), command.trace_context)
                elif kind == "cancel":
                    self.stop(command.stream_id)
                elif command.stream_id not in self.tasks:  # a running stream is not ended for it
                    self._end(
                        command.stream_id, InvalidArgument("a GenerateStream command needs `generate` or `cancel`")
                    )

    def _responses(
        self, request: inference_pb2.GenerateRequest
    ) -> Callable[[], AsyncIterator[inference_pb2.GenerateResponse]]:
        return lambda: self._handler(request, self._context)
