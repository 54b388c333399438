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

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Iterator

from turnout.carried_streams import Carrier, CarrierServer, carried_span, set_end
from turnout.errors import InvalidArgument, ResourceExhausted, Unavailable
from turnout.grpc_server import MAX_MESSAGE_BYTES
from turnout.v1 import engine_pb2

Generate = Callable[[engine_pb2.EngineGenerateRequest], AsyncIterator[engine_pb2.EngineGenerateResponse]]

# Each request is traced and reported as its own Generate call would be.
_METHOD = "turnout.v1.Engine/Generate"
# The most one message of the stream carries: half what a channel takes (MAX_MESSAGE_BYTES), so a
# message never nears the limit; the framing of an item (tag, length) is a few bytes (_ITEM_OVERHEAD).
MESSAGE_BUDGET = MAX_MESSAGE_BYTES // 2
_ITEM_OVERHEAD = 16


def _refused(request_id: str, size: int) -> engine_pb2.EngineStreamItem:
    """The end of a request whose one output is too big to send."""
    item = engine_pb2.EngineStreamItem(request_id=request_id)
    set_end(
        item.end,
        ResourceExhausted(
            f"an output of {size} bytes is over the {MESSAGE_BUDGET} bytes a message may carry "
            "(hidden states of a long prompt?); the request was aborted"
        ),
        _METHOD,
    )
    return item


class GenerateStreams(CarrierServer):
    """Serves GenerateStream calls with a servicer's per-request `generate`."""

    def __init__(self, generate: Generate, service: str = "engine") -> None:
        super().__init__()
        self._generate = generate
        self._service = service

    async def serve(
        self, commands: AsyncIterator[engine_pb2.EngineStreamCommand]
    ) -> AsyncIterator[engine_pb2.EngineStreamOutputs]:
        async for outputs in self._serve(_Stream(self), commands):
            yield outputs


class _Stream(Carrier[engine_pb2.EngineStreamCommand, engine_pb2.EngineStreamOutputs]):
    def __init__(self, owner: GenerateStreams) -> None:
        super().__init__(owner, engine_pb2.EngineStreamOutputs)
        self._owner = owner

    def split(self, batch: engine_pb2.EngineStreamOutputs) -> Iterable[engine_pb2.EngineStreamOutputs]:
        return self._within_limit(batch)

    def _within_limit(self, outputs: engine_pb2.EngineStreamOutputs) -> Iterator[engine_pb2.EngineStreamOutputs]:
        """`outputs` in messages of at most MESSAGE_BUDGET bytes: many requests' outputs together must not
        make a message the caller cannot take, which would break the stream under every one of them. An
        item too big on its own (hidden states of a long prompt) ends its request alone, as its own
        call's over-sized message would have."""
        if outputs.ByteSize() <= MESSAGE_BUDGET:
            yield outputs
            return
        part, size = engine_pb2.EngineStreamOutputs(), 0
        refused: set[str] = set()
        for item in outputs.items:
            if item.request_id in refused:
                continue  # ended: nothing follows its end
            item_size = item.ByteSize() + _ITEM_OVERHEAD
            if item_size > MESSAGE_BUDGET:
                refused.add(item.request_id)
                self._abort(item.request_id)
                item = _refused(item.request_id, item_size)
                item_size = item.ByteSize() + _ITEM_OVERHEAD
            if part.items and size + item_size > MESSAGE_BUDGET:
                yield part
                part, size = engine_pb2.EngineStreamOutputs(), 0
            part.items.append(item)
            size += item_size
        if part.items:
            yield part

    async def read(self, commands: AsyncIterator[engine_pb2.EngineStreamCommand]) -> None:
        async for command in commands:
            kind = command.WhichOneof("kind")
            if kind == "generate":
                self._start(command.generate)
            elif kind == "abort":
                self._abort(command.abort.request_id)

    def _start(self, request: engine_pb2.EngineGenerateRequest) -> None:
        request_id = request.request_id
        if self._owner.draining:
            self._end(request_id, Unavailable("engine is shutting down"))
        elif request_id in self.tasks:
            self._end(request_id, InvalidArgument(f"request id {request_id!r} is already in use"))
        else:
            self.tasks[request_id] = asyncio.create_task(self._run(request))

    def _abort(self, request_id: str) -> None:
        task = self.tasks.pop(request_id, None)
        if task is not None:
            task.cancel()

    async def _run(self, request: engine_pb2.EngineGenerateRequest) -> None:
        request_id = request.request_id
        try:
            with carried_span(self._owner._service, _METHOD, request.trace_context):
                async for response in self._owner._generate(request):
                    item = self.pending.items.add()
                    item.request_id = request_id
                    item.response.CopyFrom(response)
                    self.wake()
        except asyncio.CancelledError:
            raise  # aborted, or the stream is closing: nobody waits for an end
        except Exception as exc:
            self._end(request_id, exc)
        else:
            self._end(request_id, None)
        finally:
            if self.tasks.get(request_id) is asyncio.current_task():
                del self.tasks[request_id]
            self.wake()

    def _end(self, request_id: str, exc: BaseException | None) -> None:
        item = self.pending.items.add()
        item.request_id = request_id
        set_end(item.end, exc, _METHOD)
        self.wake()
