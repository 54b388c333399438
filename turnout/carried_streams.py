"""What every stream carried inside another gRPC stream shares (Inference.GenerateStream,
Engine.GenerateStream, Tokenizer.DetokenizeStream and Tokenizer.EncodeStream): the status it ends with,
the span it is traced in, and on the serving side the carrier call itself (`Carrier`: one writer for every
carried stream's answers; `CarrierServer`: draining; `ResponseStreams`: carried streams that are each a
server-streaming handler's responses, split to the message budget; `UnaryCalls`: carried unary calls, one
answer each).

A carried stream answers exactly as its own call would, so it ends with the status that call would
have ended with (`set_end`: the one place an error becomes a `StreamEnd`, as `StatusInterceptor` is
for calls), and is traced as that call would be: a SERVER span named after the call, child of the
trace context the caller put in the request (the carrier's metadata belongs to no one request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Generic, Protocol, TypeVar

import grpc
from grpc import aio
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Status, StatusCode

from turnout.errors import InvalidArgument, ResourceExhausted, Unavailable, status_of
from turnout.grpc_server import MAX_MESSAGE_BYTES
from turnout.telemetry import tracing
from turnout.v1 import common_pb2

log = logging.getLogger(__name__)

# The most one carrier message carries: half what a channel takes (MAX_MESSAGE_BYTES), so a message
# never nears the limit; the framing of an item (tag, length) is a few bytes (ITEM_OVERHEAD).
MESSAGE_BUDGET = MAX_MESSAGE_BYTES // 2
ITEM_OVERHEAD = 16
# The most one item may be: alone in a message, it may use all of a message but its framing.
ITEM_LIMIT = MAX_MESSAGE_BYTES - 64

_CODES = {code.value[0]: code for code in grpc.StatusCode}
# Codes that say the server failed: the span is an error (as the tracing interceptor's).
_SERVER_FAULTS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)


def set_end(end: common_pb2.StreamEnd, exc: BaseException | None, method: str) -> grpc.StatusCode:
    """`end` says how the stream ended: OK (None), or the status `exc` maps to; that status is returned.
    An error that is not a TurnoutError or a passed-on call status is a bug: logged with its traceback,
    INTERNAL to the caller."""
    if exc is None:
        end.SetInParent()
        return grpc.StatusCode.OK
    code = status_of(exc)
    if code is None:
        log.exception("unhandled error in %s", method, exc_info=exc)
        code, details = grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}"
    else:
        details = _details(exc)
    end.code = code.value[0]
    end.details = details
    return code


def end_error(end: common_pb2.StreamEnd) -> aio.AioRpcError | None:
    """On the caller's side: the error a carried stream ended with, as its own call would raise it; None: OK."""
    code = _CODES.get(end.code, grpc.StatusCode.UNKNOWN)
    return None if code is grpc.StatusCode.OK else call_error(code, end.details)


def call_error(code: grpc.StatusCode, details: str) -> aio.AioRpcError:
    return aio.AioRpcError(code, aio.Metadata(), aio.Metadata(), details)


@contextlib.contextmanager
def carried_span(service: str, method: str, carrier: Mapping[str, str]) -> Iterator[None]:
    """The SERVER span of one carried stream (`method`: "turnout.v1.Engine/Generate"), current while the
    block runs; nothing when tracing is off or the caller sent no trace context."""
    tracer = tracing.tracer(service) if carrier else None
    if tracer is None:
        yield
        return
    rpc_service, _, rpc_method = method.partition("/")
    attributes = {
        "rpc.system": "grpc",
        "rpc.service": rpc_service,
        "rpc.method": rpc_method,
        "turnout.service": service,
    }
    with tracer.start_as_current_span(
        method,
        context=propagate.extract(dict(carrier)),
        kind=SpanKind.SERVER,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield
        except Exception as exc:
            code = status_of(exc) or grpc.StatusCode.INTERNAL
            span.set_attribute("rpc.grpc.status_code", code.value[0])
            if code in _SERVER_FAULTS:
                span.set_status(Status(StatusCode.ERROR, _details(exc) or code.name))
            raise
        span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.OK.value[0])


def _details(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    if callable(details):  # an AioRpcError passed on from a call the stream made
        return str(details() or "")
    return str(exc)


def current_trace_context() -> dict[str, str]:
    """The caller's side: the current trace context to put in a carried stream's request ({} when off)."""
    carrier: dict[str, str] = {}
    if tracing.enabled():
        propagate.inject(carrier)
    return carrier


class _Batch(Protocol):
    """A carrier's outgoing message: its `items` (a repeated message field) answer any of the streams it
    carries."""

    @property
    def items(self) -> Any: ...

    def ByteSize(self) -> int: ...


Batch = TypeVar("Batch", bound=_Batch)
Request = TypeVar("Request")


class CarrierServer:
    """The serving side of a carrier RPC: the calls open now, and draining (the service is stopping:
    carried streams are refused, and each carrier ends once the streams it carries have)."""

    def __init__(self) -> None:
        self.draining = False
        self._open: set[Carrier[Any, Any]] = set()

    def drain(self) -> None:
        self.draining = True
        for carrier in self._open:
            carrier.wake()

    async def _serve(self, carrier: Carrier[Request, Batch], requests: AsyncIterator[Request]) -> AsyncIterator[Batch]:
        self._open.add(carrier)
        try:
            async for message in carrier.run(requests):
                yield message
        finally:
            self._open.discard(carrier)


class Carrier(Generic[Request, Batch]):
    """One carrier call on the serving side: `read` takes the caller's messages (starting a task per
    carried stream in `tasks`), the tasks add what they have for the caller to `pending`, and what is
    pending is written as one message (`split` may make it several). The call ends once the caller is
    done (or the service drains) and no carried stream is left; leaving it cancels every task."""

    def __init__(self, server: CarrierServer, new_batch: Callable[[], Batch]) -> None:
        self.server = server
        self.tasks: dict[Any, asyncio.Task[None]] = {}
        self._new_batch = new_batch
        # Items not written yet, and the event that wakes the writer for them.
        self.pending = new_batch()
        self._ready = asyncio.Event()

    def wake(self) -> None:
        self._ready.set()

    async def read(self, requests: AsyncIterator[Request]) -> None:
        raise NotImplementedError

    def split(self, batch: Batch) -> Iterable[Batch]:
        return (batch,)

    async def run(self, requests: AsyncIterator[Request]) -> AsyncIterator[Batch]:
        reader = asyncio.create_task(self._read_then_wake(requests))
        try:
            while True:
                await self._ready.wait()
                await asyncio.sleep(0)  # one turn of the loop: what is already runnable adds its part first
                self._ready.clear()
                if len(self.pending.items):
                    batch, self.pending = self.pending, self._new_batch()
                    for message in self.split(batch):
                        yield message
                if reader.done():
                    reader.result()  # a broken request stream ends this one with its error
                if not self.tasks and (reader.done() or self.server.draining):
                    return
        finally:
            reader.cancel()
            tasks = [reader, *self.tasks.values()]
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _read_then_wake(self, requests: AsyncIterator[Request]) -> None:
        try:
            await self.read(requests)
        finally:
            self.wake()  # the writer sees the caller is done


class _Item(Protocol):
    """An answer of a `ResponseStreams` carrier: a response of one carried stream, or its end."""

    @property
    def response(self) -> Any: ...

    @property
    def end(self) -> common_pb2.StreamEnd: ...

    def ByteSize(self) -> int: ...


def _copy(target: Any, response: Any) -> None:
    target.CopyFrom(response)


class ResponseStreams(Carrier[Request, Batch]):
    """A carrier whose carried streams are each one server-streaming handler's responses, named by the
    caller's key (`key_field` of each answer): `start` runs one, `stop` cancels one as a cancelled call
    stops (no `end` follows); otherwise its responses are followed by an `end` with the status its call
    would have ended with. A message is split at MESSAGE_BUDGET bytes: many streams' answers together
    must never make a message the caller cannot take, which would break the carrier under all of them;
    an answer too big on its own ends its stream alone (RESOURCE_EXHAUSTED), as its own call's over-sized
    message would have."""

    def __init__(
        self,
        server: CarrierServer,
        new_batch: Callable[[], Batch],
        *,
        service: str,
        method: str,
        key_field: str,
        key_name: str,
        write: Callable[[Any, Any], None] | None = None,
    ) -> None:
        """`write(target, response)` puts one of a handler's responses in the next message (`target`: its
        item's empty response). A copy, unless the handler yields what its responses are made of and
        `write` builds them there: one response per step of every stream, and a copy costs about what
        building the response did."""
        super().__init__(server, new_batch)
        self._write = write or _copy
        self._service = service
        self._method = method  # each carried stream is traced and reported as this call
        self._key_field = key_field
        self._key_name = key_name  # how an error names the key: "request id"

    def start(self, key: Any, responses: Callable[[], AsyncIterator[Any]], trace_context: Mapping[str, str]) -> None:
        """Run `responses()` as the carried stream `key` (refused while draining, or when `key` runs)."""
        if self.server.draining:
            self._end(key, Unavailable(f"{self._service} is shutting down"))
        elif key in self.tasks:
            self._end(key, InvalidArgument(f"{self._key_name} {key!r} is already in use"))
        else:
            self.tasks[key] = asyncio.create_task(self._run(key, responses, trace_context))

    def stop(self, key: Any) -> None:
        task = self.tasks.pop(key, None)
        if task is not None:
            task.cancel()

    def split(self, batch: Batch) -> Iterator[Batch]:
        if batch.ByteSize() <= MESSAGE_BUDGET:
            yield batch
            return
        part, size = self._new_batch(), 0
        refused: set[Any] = set()
        for item in batch.items:
            key = getattr(item, self._key_field)
            if key in refused:
                continue  # ended: nothing follows its end
            item_size = item.ByteSize() + ITEM_OVERHEAD
            if item_size > MESSAGE_BUDGET:
                refused.add(key)
                self.stop(key)
                item = self._new_item(key)
                set_end(item.end, self._too_big(item_size), self._method)
                item_size = item.ByteSize() + ITEM_OVERHEAD
            if part.items and size + item_size > MESSAGE_BUDGET:
                yield part
                part, size = self._new_batch(), 0
            part.items.append(item)
            size += item_size
        if part.items:
            yield part

    # What makes an answer that big, for its error.
    too_big_hint = " (hidden states of a long prompt?)"

    def _too_big(self, size: int) -> ResourceExhausted:
        return ResourceExhausted(
            f"an output of {size} bytes is over the {MESSAGE_BUDGET} bytes a message may carry"
            f"{self.too_big_hint}; the request was aborted"
        )

    def _new_item(self, key: Any) -> _Item:
        """A detached answer for `key` (not in `pending`)."""
        item = self._new_batch().items.add()
        setattr(item, self._key_field, key)
        return item

    def _pending_item(self, key: Any) -> _Item:
        item = self.pending.items.add()
        setattr(item, self._key_field, key)
        return item

    async def _run(
        self, key: Any, responses: Callable[[], AsyncIterator[Any]], trace_context: Mapping[str, str]
    ) -> None:
        try:
            with carried_span(self._service, self._method, trace_context):
                async for response in responses():
                    self._write(self._pending_item(key).response, response)
                    self.wake()
        except asyncio.CancelledError:
            raise  # stopped, or the carrier is closing: nobody waits for an end
        except Exception as exc:
            self._end(key, exc)
        else:
            self._end(key, None)
        finally:
            if self.tasks.get(key) is asyncio.current_task():
                del self.tasks[key]
            self.wake()

    def _end(self, key: Any, exc: BaseException | None) -> None:
        set_end(self._pending_item(key).end, exc, self._method)
        self.wake()


class UnaryCalls(ResponseStreams[Request, Batch]):
    """A carrier whose carried items are each one unary call (`start_call`): answered by one item, its
    response, or an `end` with the status the call would have failed with; a call that succeeds gets no
    OK end after its response (the response is its end). `stop` cancels a call as a cancelled call stops:
    no answer follows."""

    too_big_hint = ""

    def start_call(self, key: Any, call: Callable[[], Awaitable[Any]], trace_context: Mapping[str, str]) -> None:
        """Run `call()` as the carried call `key` (refused while draining, or when `key` runs)."""

        async def response() -> AsyncIterator[Any]:
            yield await call()

        self.start(key, response, trace_context)

    def _end(self, key: Any, exc: BaseException | None) -> None:
        if exc is None:
            self.wake()  # answered already
        else:
            super()._end(key, exc)
