"""The router's requests to one engine, over one `Engine.GenerateStream`.

Each request used to be its own Generate call: a call's set-up, and one message (a write, a read,
wake-ups at both ends) per engine step per request. Over one stream per engine, an engine step's
outputs for every request arrive as one message, read once and handed to each request's queue.

`EngineMux.generate(request)` returns a `MuxedCall` that reads like the Generate call it replaces
(`read()` gives each `EngineGenerateResponse`, then None; a request that ended with an error
raises that status as an `aio.AioRpcError`; `cancel()` aborts the request on the engine), so
dispatch's retries, failover and accounting apply unchanged. `ready()` adds what a call cannot
give: every response that arrived while the request's reader was busy, at once.

The stream is opened on the first request and kept; when it breaks (the engine died, restarted or
stopped), every request on it fails with the stream's status, as their own calls would have, and the
next request opens a new one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

import grpc
from grpc import aio

from turnout.carried_streams import call_error, end_error
from turnout.v1 import engine_pb2, engine_pb2_grpc

_EOF = object()


class MuxedCall:
    """One request on an engine's GenerateStream, read like its own Generate call."""

    def __init__(self, session: _Session, request_id: str) -> None:
        self._session = session
        self._request_id = request_id
        # Delivered, not read yet: responses, then at most one end (_EOF or the error), which stays.
        self._items: collections.deque[engine_pb2.EngineGenerateResponse | aio.AioRpcError | object] = (
            collections.deque()
        )
        self._arrived: asyncio.Future[None] | None = None
        self._ended = False

    async def read(self) -> engine_pb2.EngineGenerateResponse | None:
        """The next response, or None after the last; raises the request's error status."""
        while not self._items:
            self._arrived = asyncio.get_running_loop().create_future()
            await self._arrived
        item = self._items[0]
        if item is _EOF:
            return None
        if isinstance(item, aio.AioRpcError):
            raise item
        self._items.popleft()
        assert isinstance(item, engine_pb2.EngineGenerateResponse)
        return item

    def ready(self) -> list[engine_pb2.EngineGenerateResponse]:
        """The responses that have arrived and are not read yet, without waiting (the end stays for
        `read`): everything the engine sent while this request's reader was busy."""
        out: list[engine_pb2.EngineGenerateResponse] = []
        while self._items and isinstance(item := self._items[0], engine_pb2.EngineGenerateResponse):
            out.append(item)
            self._items.popleft()
        return out

    def cancel(self) -> bool:
        """Abort the request on the engine; what was delivered and not read is dropped, and a read
        raises CANCELLED. False when it had ended already."""
        if self._ended:
            return False
        self._ended = True
        self._items.clear()
        self._put(call_error(grpc.StatusCode.CANCELLED, "cancelled"))
        self._session.abort(self._request_id)
        return True

    def _put(self, item: engine_pb2.EngineGenerateResponse | aio.AioRpcError | object) -> None:
        self._items.append(item)
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)

    def _deliver(self, item: engine_pb2.EngineStreamItem) -> None:
        if item.WhichOneof("kind") == "response":
            self._put(item.response)
            return
        self._ended = True
        self._put(end_error(item.end) or _EOF)

    def _fail(self, error: aio.AioRpcError) -> None:
        if not self._ended:
            self._ended = True
            self._put(error)


class _Session:
    """One open GenerateStream and the requests on it."""

    def __init__(self, mux: EngineMux, stub: engine_pb2_grpc.EngineStub) -> None:
        self._mux = mux
        self.calls: dict[str, MuxedCall] = {}
        self._commands: asyncio.Queue[engine_pb2.EngineStreamCommand | None] = asyncio.Queue()
        self._stream = stub.GenerateStream(self._send())
        self._reader = asyncio.get_running_loop().create_task(self._read())

    def start(self, request: engine_pb2.EngineGenerateRequest) -> MuxedCall:
        call = MuxedCall(self, request.request_id)
        self.calls[request.request_id] = call
        self._commands.put_nowait(engine_pb2.EngineStreamCommand(generate=request))
        return call

    def abort(self, request_id: str) -> None:
        if self.calls.pop(request_id, None) is not None and not self._reader.done():
            self._commands.put_nowait(
                engine_pb2.EngineStreamCommand(abort=engine_pb2.AbortRequest(request_id=request_id))
            )

    async def close(self) -> None:
        self._stream.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    async def _send(self) -> AsyncIterator[engine_pb2.EngineStreamCommand]:
        while (command := await self._commands.get()) is not None:
            yield command

    async def _read(self) -> None:
        error: aio.AioRpcError | None = None
        try:
            async for outputs in self._stream:
                calls = self.calls
                for item in outputs.items:
                    call = calls.get(item.request_id)
                    if call is None:
                        continue  # aborted here; what the engine sent before the abort reached it
                    if item.WhichOneof("kind") == "end":
                        del calls[item.request_id]
                    call._deliver(item)
        except aio.AioRpcError as exc:
            error = exc
        except asyncio.CancelledError:
            error = call_error(grpc.StatusCode.CANCELLED, "the router closed the engine stream")
            raise
        finally:
            self._mux._ended(self)
            self._commands.put_nowait(None)
            failure = error or call_error(
                grpc.StatusCode.UNAVAILABLE, "the engine ended its GenerateStream (shutting down?)"
            )
            for call in self.calls.values():
                call._fail(failure)
            self.calls.clear()


class EngineMux:
    """The requests this router sends to one engine, over one GenerateStream at a time."""

    def __init__(self, stub: engine_pb2_grpc.EngineStub) -> None:
        self._stub = stub
        self._session: _Session | None = None

    def generate(self, request: engine_pb2.EngineGenerateRequest) -> MuxedCall:
        """Start `request` on the engine (opening the stream if none is open)."""
        if self._session is None:
            self._session = _Session(self, self._stub)
        return self._session.start(request)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _ended(self, session: _Session) -> None:
        if self._session is session:
            self._session = None
