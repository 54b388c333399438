"""The calling side of a carrier (Inference.GenerateStream from the gateway, Engine.GenerateStream and
Tokenizer.DetokenizeStream from the router): one long-lived call that carries many streams.

`CarrierCall` is one open carrier call (`ResponseStreamsCall`: one whose carried streams are each a
server stream, as Generate's are). Commands for any carried stream are added to `outgoing` (a
message with repeated `items`), and what is due goes out as one message after one turn of the event
loop, so the streams that start or move on in the same turn share a write. Past MESSAGE_BUDGET bytes
the write is split: many streams' commands together must never make a message the server refuses,
which would break the carrier under all of them; a command over ITEM_LIMIT on its own is not sent,
and only its stream fails (`refuse`, RESOURCE_EXHAUSTED), as its own call's message would have.
Every answer read is handed to `deliver`. When the call ends or breaks (the server died, restarted
or stopped), `broken` runs once, with the status every stream still on it fails with, as their own
calls would have failed (UNAVAILABLE where gRPC lost the server's status: `_status_of_break`).

`OpenCarrier` is the one carrier call a client keeps to a server (the gateway's to the router, the
router's to each engine and each tokenizer): opened when first needed, forgotten once it breaks, so the
next use opens a new one.

`AnsweredCall` is a carrier call whose items are each answered once (the router's Detokenize exchanges and
Encode calls): the futures waiting for the answers, failed together when the call breaks.

`CarriedCall` is one carried server-streaming stream read like its own call: `read()` gives each
response, then None (where a call gives `aio.EOF`); a stream that ended with an error raises that
status as an `aio.AioRpcError`; `ready()` takes everything that arrived while its reader was busy;
`cancel()` stops it on the server. So the code that read calls reads carried streams alike.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

import grpc
from grpc import aio

from turnout import carried_streams
from turnout.carried_streams import call_error, end_error
from turnout.v1 import common_pb2


class _Message(Protocol):
    @property
    def items(self) -> Any: ...

    def ByteSize(self) -> int: ...


Outgoing = TypeVar("Outgoing", bound=_Message)
Response = TypeVar("Response")

# A carried stream's end, delivered and not read yet: _EOF, or the error it ended with.
_EOF = object()
_End: TypeAlias = aio.AioRpcError | object
# The details of the status gRPC's aio sets itself when a batch operation fails in its core; the
# server's status, if it sent one, is lost.
_CORE_FAILURE = "Internal error from Core"


class CarrierCall(Generic[Outgoing]):
    """One open carrier call; subclasses say what an answer does (`deliver`) and what a broken call
    does to the streams on it (`broken`)."""

    def __init__(
        self, open_call: Callable[[AsyncIterator[Outgoing]], Any], new_outgoing: Callable[[], Outgoing], what: str
    ) -> None:
        self._new_outgoing = new_outgoing
        self._what = what  # names the carrier in its errors: "the engine's GenerateStream"
        self.outgoing = new_outgoing()
        self.error: aio.AioRpcError | None = None
        self._due = asyncio.Event()
        # Opened outside the request that happens to come first: the carrier belongs to no request (its
        # metadata carries no trace context, and its tasks no request's context variables).
        context = contextvars.Context()
        self._call = context.run(open_call, self._send())
        self._reader = asyncio.get_running_loop().create_task(self._read(), context=context)

    def due(self) -> None:
        """`outgoing` has items to send: they go out after one turn of the loop."""
        self._due.set()

    def deliver(self, answer: Any) -> None:
        raise NotImplementedError

    def broken(self, error: aio.AioRpcError) -> None:
        raise NotImplementedError

    def refuse(self, item: Any, error: aio.AioRpcError) -> None:
        """`item` is too big to send: it is dropped, and its stream must fail with `error`."""
        raise NotImplementedError

    async def close(self) -> None:
        self._call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    async def _send(self) -> AsyncIterator[Outgoing]:
        while self.error is None:
            await self._due.wait()
            await asyncio.sleep(0)  # one turn of the loop: what is already runnable adds its part first
            self._due.clear()
            if self.outgoing.items:
                message, self.outgoing = self.outgoing, self._new_outgoing()
                for part in self._within_budget(message):
                    yield part

    def _within_budget(self, message: Outgoing) -> Iterator[Outgoing]:
        budget = carried_streams.MESSAGE_BUDGET
        if message.ByteSize() <= budget:
            yield message
            return
        part, size = self._new_outgoing(), 0
        for item in message.items:
            item_size = item.ByteSize() + carried_streams.ITEM_OVERHEAD
            if item_size > carried_streams.ITEM_LIMIT:
                limit = carried_streams.ITEM_LIMIT
                message_text = f"a request of {item_size} bytes is over the {limit} bytes a message may carry"
                self.refuse(item, call_error(grpc.StatusCode.RESOURCE_EXHAUSTED, message_text))
                continue
            if part.items and size + item_size > budget:
                yield part
                part, size = self._new_outgoing(), 0
            part.items.append(item)
            size += item_size
        if part.items:
            yield part

    async def _read(self) -> None:
        error: aio.AioRpcError | None = None
        try:
            async for message in self._call:
                for answer in message.items:
                    self.deliver(answer)
        except aio.AioRpcError as exc:
            error = self._status_of_break(exc)
        except asyncio.CancelledError:
            error = call_error(grpc.StatusCode.CANCELLED, f"{self._what} was closed by this side")
            raise
        finally:
            self.error = error or call_error(grpc.StatusCode.UNAVAILABLE, f"the server ended {self._what}")
            self._due.set()  # the sender sees the error and ends
            self.broken(self.error)

    def _status_of_break(self, exc: aio.AioRpcError) -> aio.AioRpcError:
        """The status the streams on a broken carrier fail with: the call's, except where gRPC lost it.
        A write that fails in gRPC's core (the server died or ended the call while this side was still
        sending) ends the call with INTERNAL and gRPC's own words (_CORE_FAILURE) instead of the server's
        status: the server is gone or going, as when the connection breaks, so UNAVAILABLE (and the
        streams may be tried again), not an internal error of the server's."""
        if exc.code() is grpc.StatusCode.INTERNAL and exc.details() == _CORE_FAILURE:
            detail = (
                f"{self._what} broke while this side was writing (gRPC: {_CORE_FAILURE!r}); the server is gone or going"
            )
            return call_error(grpc.StatusCode.UNAVAILABLE, detail)
        return exc


class AnsweredCall(CarrierCall[Outgoing], Generic[Outgoing, Response]):
    """A carrier call whose items are each answered once, by an answer naming the same key (a Detokenize
    exchange, an Encode call): `expect(key)` is the answer's future; `settle` resolves it; an item too big
    to send (`refuse`) and a broken call (`broken`) fail the futures waiting, as their own calls would have
    failed. `forget(self)` tells the owner the call broke."""

    def __init__(
        self,
        forget: Callable[[Any], None],
        open_call: Callable[[AsyncIterator[Outgoing]], Any],
        new_outgoing: Callable[[], Outgoing],
        what: str,
    ) -> None:
        self._forget = forget
        self._waiting: dict[int, asyncio.Future[Response]] = {}
        super().__init__(open_call, new_outgoing, what)

    def key_of(self, item: Any) -> int:
        """The key an outgoing item names."""
        raise NotImplementedError

    def expect(self, key: int) -> asyncio.Future[Response]:
        answer: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        self._waiting[key] = answer
        return answer

    def settle(self, key: int, response: Response | None = None, error: BaseException | None = None) -> None:
        """`key`'s answer is `response` (or `error`); nothing when no one waits for it any more."""
        waiting = self._waiting.pop(key, None)
        if waiting is None or waiting.done():
            return
        if error is not None:
            waiting.set_exception(error)
        else:
            waiting.set_result(response)  # type: ignore[arg-type]

    def refuse(self, item: Any, error: aio.AioRpcError) -> None:
        self.settle(self.key_of(item), error=error)

    def broken(self, error: aio.AioRpcError) -> None:
        self._forget(self)
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(error)
        self._waiting.clear()


Call = TypeVar("Call", bound=CarrierCall[Any])


class OpenCarrier(Generic[Call]):
    """The carrier call open now, if any. `open_call(forget)` opens a new one, which calls `forget(itself)`
    once it has broken; a later call that broke says nothing of the one opened since."""

    def __init__(self, open_call: Callable[[Callable[[Call], None]], Call]) -> None:
        self._open_call = open_call
        self.current: Call | None = None

    def get(self) -> Call:
        """The open call, opening one if none is."""
        if self.current is None:
            self.current = self._open_call(self._forget)
        return self.current

    async def close(self) -> None:
        if self.current is not None:
            await self.current.close()

    def _forget(self, call: Call) -> None:
        if self.current is call:
            self.current = None


class CarriedCall(Generic[Response]):
    """One carried stream, read like its own server-streaming call. `on_cancel` tells the server."""

    def __init__(self, on_cancel: Callable[[], None]) -> None:
        self._on_cancel = on_cancel
        # Delivered, not read yet: responses, then at most one end (_EOF or the error), which stays.
        self._items: collections.deque[Response | _End] = collections.deque()
        self._arrived: asyncio.Future[None] | None = None
        self._ended = False
        self._deadline: asyncio.TimerHandle | None = None

    async def read(self) -> Response | None:
        """The next response, or None after the last; raises the stream's error status."""
        while not self._items:
            self._arrived = asyncio.get_running_loop().create_future()
            await self._arrived
        item = self._items[0]
        if item is _EOF:
            return None
        if isinstance(item, aio.AioRpcError):
            raise item
        return self._items.popleft()  # type: ignore[return-value]

    def has_ready(self) -> bool:
        """Whether `read` would return (or raise) without waiting."""
        return bool(self._items)

    def ready(self) -> list[Response]:
        """The responses that have arrived and are not read yet, without waiting (the end stays for
        `read`): everything the server sent while this stream's reader was busy."""
        out: list[Response] = []
        items = self._items
        while items and items[0] is not _EOF and not isinstance(items[0], aio.AioRpcError):
            out.append(items.popleft())  # type: ignore[arg-type]
        return out

    def cancel(self) -> bool:
        """Stop the stream on the server; what was delivered and not read is dropped, and a read raises
        CANCELLED. False when it had ended already."""
        return self._stop(call_error(grpc.StatusCode.CANCELLED, "Locally cancelled by application!"))

    def set_deadline(self, timeout_s: float | None) -> None:
        """Give the stream a call's deadline: once `timeout_s` has passed it is cancelled on the server and
        a read raises DEADLINE_EXCEEDED."""
        if timeout_s is not None:
            self._deadline = asyncio.get_running_loop().call_later(timeout_s, self._expire)

    def respond(self, response: Response) -> None:
        self._put(response)

    def end(self, end: common_pb2.StreamEnd) -> None:
        """The server ended the stream: OK, or with the status its call would have ended with."""
        self._finish()
        self._put(end_error(end) or _EOF)

    def fail(self, error: aio.AioRpcError) -> None:
        """The carrier broke under the stream."""
        if not self._ended:
            self._finish()
            self._put(error)

    def _expire(self) -> None:
        self._stop(call_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def _stop(self, error: aio.AioRpcError) -> bool:
        if self._ended:
            return False
        self._finish()
        self._items.clear()
        self._put(error)
        self._on_cancel()
        return True

    def _put(self, item: Response | _End) -> None:
        self._items.append(item)
        if self._arrived is not None and not self._arrived.done():
            self._arrived.set_result(None)

    def _finish(self) -> None:
        self._ended = True
        if self._deadline is not None:
            self._deadline.cancel()


class ResponseStreamsCall(CarrierCall[Outgoing], Generic[Outgoing, Response]):
    """A carrier call whose carried streams are each a server stream (`CarriedCall`), named in its answers
    by `key_field`; `on_broken` runs once the call has broken, before its streams fail."""

    def __init__(
        self,
        open_call: Callable[[AsyncIterator[Outgoing]], Any],
        new_outgoing: Callable[[], Outgoing],
        what: str,
        *,
        key_field: str,
        key_of_command: Callable[[Any], Any],
        on_broken: Callable[[], None],
    ) -> None:
        self.streams: dict[Any, CarriedCall[Response]] = {}
        self._key_field = key_field
        self._key_of_command = key_of_command
        self._on_broken = on_broken
        super().__init__(open_call, new_outgoing, what)

    def open_stream(self, key: Any, on_cancel: Callable[[], None]) -> CarriedCall[Response]:
        stream: CarriedCall[Response] = CarriedCall(on_cancel)
        self.streams[key] = stream
        return stream

    def forget(self, key: Any) -> bool:
        """Drop the stream `key` (it was cancelled here); False when it had ended or was unknown."""
        return self.streams.pop(key, None) is not None and self.error is None

    def deliver(self, answer: Any) -> None:
        key = getattr(answer, self._key_field)
        stream = self.streams.get(key)
        if stream is None:
            return  # cancelled here; what the server sent before the cancel reached it
        if answer.WhichOneof("kind") == "response":
            stream.respond(answer.response)
        else:
            del self.streams[key]
            stream.end(answer.end)

    def refuse(self, item: Any, error: aio.AioRpcError) -> None:
        stream = self.streams.pop(self._key_of_command(item), None)
        if stream is not None:
            stream.fail(error)

    def broken(self, error: aio.AioRpcError) -> None:
        self._on_broken()
        for stream in self.streams.values():
            stream.fail(error)
        self.streams.clear()
