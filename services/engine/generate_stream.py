"""Engine.GenerateStream: many Generate requests over one stream.

One gRPC stream per request costs a call's set-up, and a message with its own write, read and
wake-ups at both ends for every step of every request. Over one stream per caller, what became
ready for all of its requests since the last write goes out as one message: one write per engine
step (more steps per message while the reader lags), whatever the number of requests.

Each request still runs exactly as its own Generate call would (`generate`, the servicer's per-request
generator): its responses are the same messages, in the same order, then an `end` with the status
its call would have ended with. An `abort` command, or the stream closing, stops requests the way a
cancelled call does. While the service drains (`drain()`), new requests are refused UNAVAILABLE and
the stream ends once its running requests have finished, so a graceful stop does not wait out its
grace period for an idle stream.

A request's trace context comes in the request (`trace_context`), not in the stream's metadata:
its SERVER span is opened here, named as the Generate call's would be.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from turnout.carried_streams import CarrierServer, ResponseStreams
from turnout.v1 import engine_pb2

# A request's responses, or what they are made of when `write` builds them (GenerateStreams).
Generate = Callable[[engine_pb2.EngineGenerateRequest], AsyncIterator[Any]]

# Each request is traced and reported as its own Generate call would be.
_METHOD = "turnout.v1.Engine/Generate"


class GenerateStreams(CarrierServer):
    """Serves GenerateStream calls with a servicer's per-request `generate`. `write(target, item)` puts
    each item it yields in the stream's next message, as the response it stands for (`target`: empty);
    by default the items are the responses, copied."""

    def __init__(
        self, generate: Generate, service: str = "engine", write: Callable[[Any, Any], None] | None = None
    ) -> None:
        super().__init__()
        self._generate = generate
        self._service = service
        self._write = write

    async def serve(
        self, commands: AsyncIterator[engine_pb2.EngineStreamCommands]
    ) -> AsyncIterator[engine_pb2.EngineStreamOutputs]:
        async for outputs in self._serve(_Stream(self), commands):
            yield outputs


class _Stream(ResponseStreams[engine_pb2.EngineStreamCommands, engine_pb2.EngineStreamOutputs]):
    """One GenerateStream call: its requests, named by their request ids."""

    def __init__(self, owner: GenerateStreams) -> None:
        super().__init__(
            owner,
            engine_pb2.EngineStreamOutputs,
            service=owner._service,
            method=_METHOD,
            key_field="request_id",
            key_name="request id",
            write=owner._write,
        )
        self._owner = owner

    async def read(self, messages: AsyncIterator[engine_pb2.EngineStreamCommands]) -> None:
        async for message in messages:
            for command in message.items:
                kind = command.WhichOneof("kind")
                if kind == "generate":
                    request = command.generate
                    self.start(request.request_id, self._responses(request), request.trace_context)
                elif kind == "abort":
                    self.stop(command.abort.request_id)

    def _responses(
        self, request: engine_pb2.EngineGenerateRequest
    ) -> Callable[[], AsyncIterator[engine_pb2.EngineGenerateResponse]]:
        generate = self._owner._generate
        return lambda: generate(request)
