"""Tokenizer.DetokenizeStream: many Detokenize streams carried by one.

Every sample the router streams used to be its own Detokenize call: a call's set-up, and a write and
a read at each end for every engine message of every sample. Carried by one stream per router, the
answers that are ready for every sample go out as one message, and the router's messages bring the
tokens of every sample it read from its engines at once.

Each carried stream runs exactly as its own call would (`detokenize`, the servicer's handler of one
Detokenize call, fed the stream's messages as they come): the same answers in the same order, then an
`end` with the status its call would have ended with (OK once the caller closed it). Closing the
carrier stops every stream on it. While the service drains (`drain()`), new streams are refused
UNAVAILABLE and the carrier ends once its streams have.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import grpc

from turnout.carried_streams import Carrier, CarrierServer, carried_span, set_end
from turnout.errors import InvalidArgument, Unavailable
from turnout.v1 import tokenizer_pb2

OnEnd = Callable[[str, grpc.StatusCode, float], None]
Detokenize = Callable[[AsyncIterator[tokenizer_pb2.DetokenizeRequest]], AsyncIterator[tokenizer_pb2.DetokenizeResponse]]

# Each carried stream is traced and reported as its own Detokenize call would be.
_METHOD = "turnout.v1.Tokenizer/Detokenize"


class DetokenizeStreams(CarrierServer):
    """Serves DetokenizeStream calls with a servicer's handler of one Detokenize call. `on_end(method,
    code, seconds)` hears of each carried stream's end, as the per-call metrics would of its call.
    `drain()`: new streams are refused (UNAVAILABLE), and each carrier ends once its streams have, so
    a graceful stop does not wait out its grace period for a carrier kept open."""

    def __init__(self, detokenize: Detokenize, service: str = "tokenizer", on_end: OnEnd | None = None) -> None:
        super().__init__()
        self._detokenize = detokenize
        self._service = service
        self._on_end = on_end

    async def serve(
        self, requests: AsyncIterator[tokenizer_pb2.DetokenizeStreamRequest]
    ) -> AsyncIterator[tokenizer_pb2.DetokenizeStreamResponse]:
        async for answers in self._serve(_Carrier(self), requests):
            yield answers


_CLOSE = None


class _Carrier(Carrier[tokenizer_pb2.DetokenizeStreamRequest, tokenizer_pb2.DetokenizeStreamResponse]):
    def __init__(self, owner: DetokenizeStreams) -> None:
        super().__init__(owner, tokenizer_pb2.DetokenizeStreamResponse)
        self._owner = owner
        # Each open stream's messages not read by its handler yet (None: closed); its task is in `tasks`.
        self._inputs: dict[int, asyncio.Queue[tokenizer_pb2.DetokenizeRequest | None]] = {}

    async def read(self, requests: AsyncIterator[tokenizer_pb2.DetokenizeStreamRequest]) -> None:
        try:
            async for message in requests:
                for item in message.items:
                    self._take(item)
        finally:
            # The caller is done: its streams get no more messages.
            for queue in self._inputs.values():
                queue.put_nowait(_CLOSE)

    def _take(self, item: tokenizer_pb2.DetokenizeStreamItem) -> None:
        stream_id = item.stream_id
        queue = self._inputs.get(stream_id)
        if item.WhichOneof("kind") != "request":  # close
            if queue is not None:
                queue.put_nowait(_CLOSE)
                del self._inputs[stream_id]
            return
        if queue is None:
            if stream_id in self.tasks:  # closed, not ended yet
                self._end(stream_id, InvalidArgument(f"stream {stream_id} was closed"))
                return
            if self._owner.draining:
                self._end(stream_id, Unavailable("tokenizer is shutting down"))
                return
            queue = self._inputs[stream_id] = asyncio.Queue()
            start = item.request.start if item.request.WhichOneof("kind") == "start" else None
            self.tasks[stream_id] = asyncio.create_task(self._run(stream_id, queue, start))
        queue.put_nowait(item.request)

    async def _run(
        self,
        stream_id: int,
        queue: asyncio.Queue[tokenizer_pb2.DetokenizeRequest | None],
        start: tokenizer_pb2.DetokenizeStart | None,
    ) -> None:
        async def messages() -> AsyncIterator[tokenizer_pb2.DetokenizeRequest]:
            while (message := await queue.get()) is not _CLOSE:
                yield message

        started, code = time.perf_counter(), grpc.StatusCode.CANCELLED
        try:
            trace_context = start.trace_context if start is not None else {}
            with carried_span(self._owner._service, _METHOD, trace_context):
                async for response in self._owner._detokenize(messages()):
                    item = self.pending.items.add()
                    item.stream_id = stream_id
                    item.response.CopyFrom(response)
                    self.wake()
        except asyncio.CancelledError:
            raise  # the carrier is closing: nobody waits for an end
        except Exception as exc:
            code = self._end(stream_id, exc)
        else:
            code = self._end(stream_id, None)
        finally:
            if self._owner._on_end is not None:
                self._owner._on_end(_METHOD.rpartition("/")[2], code, time.perf_counter() - started)
            del self.tasks[stream_id]
            if self._inputs.get(stream_id) is queue:
                del self._inputs[stream_id]  # refused: later messages of this id are answered as closed
            self.wake()

    def _end(self, stream_id: int, exc: BaseException | None) -> grpc.StatusCode:
        item = self.pending.items.add()
        item.stream_id = stream_id
        code = set_end(item.end, exc, _METHOD)
        self.wake()
        return code
