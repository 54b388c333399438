"""The gateway's Generate calls to the router, carried by one `Inference.GenerateStream`.

Each HTTP request used to make its own Generate call: a call's set-up, and a gRPC message (a write
in the router, a read here, wake-ups at both ends) for every batch of output of every request.
Carried by one stream, what the router has ready for every request comes as one message, and the
requests that start while the gateway works go out as one.

`GenerateCarrier.generate(request, timeout_s)` returns a `CarriedGenerate` that reads like the
Generate call it replaces: `read()` gives each response, then `aio.EOF`; a stream that ended with an
error raises that status as an `aio.AioRpcError`; `cancel()` stops it on the router. The deadline is
kept here: when it passes, the stream is cancelled on the router and `read()` raises
DEADLINE_EXCEEDED, as the call's would. So `Generation` and `RouterClient`'s retry work unchanged.

The carrier is opened with the first request and kept. When it breaks (the router died, restarted or
stopped), every stream on it fails with the carrier's status, as their own calls would have, and the
next request opens a new one. Responses are queued per stream without a bound, as the router queues
the engine's: a slow HTTP client's output waits here, not in the router (one reader serves every
stream, so it never waits for one).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import itertools
from collections.abc import AsyncIterator
from typing import TypeAlias

import grpc
from grpc import aio

from turnout.carried_streams import call_error, current_trace_context, end_error
from turnout.v1 import inference_pb2, inference_pb2_grpc

# A carried stream's end as `read` gives it: aio.EOF, or the error it ended with.
_End: TypeAlias = aio.AioRpcError | object


class CarriedGenerate:
    """One Generate stream on the carrier, read like its own call."""

    def __init__(self, session: _Session, stream_id: int) -> None:
        self._session = session
        self._stream_id = stream_id
        # Delivered, not read yet: responses, then at most one end (aio.EOF or the error), which stays.
        self._items: collections.deque[inference_pb2.GenerateResponse | _End] = collections.deque()
        self._arrived: asyncio.Future[None] | None = None
        self._ended = False
        self._deadline: asyncio.TimerHandle | None = None

    async def read(self) -> inference_pb2.GenerateResponse | object:
        """The next response, or aio.EOF after the last; raises the stream's error status."""
        while not self._items:
            self._arrived = asyncio.get_running_loop().create_future()
            await self._arrived
        item = self._items[0]
        if item is aio.EOF:
            return item
        if isinstance(item, aio.AioRpcError):
            raise item
        return self._items.popleft()

    def cancel(self) -> bool:
        """Stop the stream on the router; what was delivered and not read is dropped, and a read raises
        CANCELLED. False when it had ended already."""
        return self._stop(call_error(grpc.StatusCode.CANCELLED, "Locally cancelled by application!"))

    def _expire(self) -> None:
        self._stop(call_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def _stop(self, error: aio.AioRpcError) -> bool:
        if self._ended:
            return False
        self._finish(error)
        self._items.clear()
        self._items.append(error)
        self._session.cancel(self._stream_id)
        return True

    def _put(self, item: inference_pb2.GenerateResponse | _End) -> None:
        self._items.append(item)
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)

    def _deliver(self, answer: inference_pb2.GenerateStreamAnswer) -> None:
        if answer.WhichOneof("kind") == "response":
            self._put(answer.response)
            return
        self._finish(None)
        self._put(end_error(answer.end) or aio.EOF)

    def _fail(self, error: aio.AioRpcError) -> None:
        if not self._ended:
            self._finish(error)
            self._put(error)

    def _finish(self, error: aio.AioRpcError | None) -> None:
        self._ended = True
        if self._deadline is not None:
            self._deadline.cancel()
        if error is not None and self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)


class _Session:
    """One open GenerateStream and the streams on it."""

    def __init__(self, carrier: GenerateCarrier, stub: inference_pb2_grpc.InferenceStub) -> None:
        self._carrier = carrier
        self.streams: dict[int, CarriedGenerate] = {}
        self._outgoing = inference_pb2.GenerateStreamRequest()
        self._due = asyncio.Event()
        self._error: aio.AioRpcError | None = None
        # Opened outside the request that happens to come first: the carrier belongs to no request (its
        # metadata carries no trace context, and its tasks no request's context variables).
        context = contextvars.Context()
        self._call = context.run(stub.GenerateStream, self._send())
        self._reader = asyncio.get_running_loop().create_task(self._read(), context=context)

    def start(self, stream_id: int, request: inference_pb2.GenerateRequest, timeout_s: float | None) -> CarriedGenerate:
        stream = CarriedGenerate(self, stream_id)
        if self._error is not None:
            stream._fail(self._error)
            return stream
        self.streams[stream_id] = stream
        command = self._outgoing.items.add(stream_id=stream_id, trace_context=current_trace_context())
        command.generate.CopyFrom(request)
        self._due.set()
        if timeout_s is not None:
            stream._deadline = asyncio.get_running_loop().call_later(timeout_s, stream._expire)
        return stream

    def cancel(self, stream_id: int) -> None:
        if self.streams.pop(stream_id, None) is not None and self._error is None:
            self._outgoing.items.add(stream_id=stream_id, cancel=True)
            self._due.set()

    async def close(self) -> None:
        self._call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    async def _send(self) -> AsyncIterator[inference_pb2.GenerateStreamRequest]:
        while self._error is None:
            await self._due.wait()
            await asyncio.sleep(0)  # one turn of the loop: what is already runnable adds its part first
            self._due.clear()
            if self._outgoing.items:
                message, self._outgoing = self._outgoing, inference_pb2.GenerateStreamRequest()
                yield message

    async def _read(self) -> None:
        error: aio.AioRpcError | None = None
        try:
            async for message in self._call:
                streams = self.streams
                for answer in message.items:
                    stream = streams.get(answer.stream_id)
                    if stream is None:
                        continue  # cancelled here; what the router sent before the cancel reached it
                    if answer.WhichOneof("kind") == "end":
                        del streams[answer.stream_id]
                    stream._deliver(answer)
        except aio.AioRpcError as exc:
            error = exc
        except asyncio.CancelledError:
            error = call_error(grpc.StatusCode.CANCELLED, "the gateway closed the router stream")
            raise
        finally:
            self._error = error or call_error(grpc.StatusCode.UNAVAILABLE, "the router ended its GenerateStream")
            self._due.set()  # the sender sees the error and ends
            self._carrier._ended(self)
            for stream in self.streams.values():
                stream._fail(self._error)
            self.streams.clear()


class GenerateCarrier:
    """The gateway's Generate streams to the router, over one GenerateStream at a time."""

    def __init__(self, stub: inference_pb2_grpc.InferenceStub) -> None:
        self._stub = stub
        self._session: _Session | None = None
        self._ids = itertools.count(1)

    def generate(self, request: inference_pb2.GenerateRequest, timeout_s: float | None) -> CarriedGenerate:
        """Start `request` on the router (opening the carrier if none is open)."""
        if self._session is None:
            self._session = _Session(self, self._stub)
        return self._session.start(next(self._ids), request, timeout_s)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _ended(self, session: _Session) -> None:
        if self._session is session:
            self._session = None
