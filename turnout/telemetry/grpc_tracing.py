"""Trace context across gRPC: W3C `traceparent` added to every outgoing call's metadata (by the
channel, `traced()`), extracted by every server, whose interceptor opens one SERVER span per call
around the handler.

Both exist only while tracing is on (`traced()` returns the plain channel and
`server_interceptors()` nothing otherwise), so a service without tracing does no tracing work
per call. There are no CLIENT spans: one request is one trace with one span per service hop.

Health checks, reflection and the router's background polls of engines (GetLoad, GetModelInfo
without a caller's trace context) are not traced: they would bury requests in noise. The router's and
the engine's GenerateStream and the tokenizer's DetokenizeStream and EncodeStream carry many requests'
streams or calls, each with its trace context in its request: their spans are opened per carried stream or
call, none for the carrier.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, cast

import grpc
from grpc import aio
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from turnout.metadata_channel import MetadataChannel
from turnout.telemetry import tracing

_UNTRACED_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")
_POLLS = frozenset({"/turnout.v1.Engine/GetLoad", "/turnout.v1.Engine/GetModelInfo"})
# Streams that carry many requests' streams: each carried one's span is opened from the trace context
# in its request (turnout/carried_streams.py), never one span for the carrier.
_CARRIERS = frozenset(
    {
        "/turnout.v1.Inference/GenerateStream",
        "/turnout.v1.Engine/GenerateStream",
        "/turnout.v1.Tokenizer/DetokenizeStream",
        "/turnout.v1.Tokenizer/EncodeStream",
    }
)
# Status codes that say the server failed (the span is an error), as OpenTelemetry's gRPC conventions.
_SERVER_FAULTS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


# -- client side: inject -------------------------------------------------------


def _with_trace_context(metadata: Any) -> Any:
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:  # no span is current: nothing to carry
        return metadata
    return aio.Metadata(*(metadata or ()), *carrier.items())


class TracingChannel(MetadataChannel):
    """A channel whose calls carry the current trace context."""

    def __init__(self, channel: aio.Channel) -> None:
        super().__init__(channel, _with_trace_context)


def traced(channel: aio.Channel) -> aio.Channel:
    """The channel itself while tracing is off; one that carries the trace context while on."""
    return cast(aio.Channel, TracingChannel(channel)) if tracing.enabled() else channel


# -- server side: extract and open the call's span -----------------------------


class TracingInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """One SERVER span per traced call, child of the caller's span when the metadata carries one.

    The span is current while the handler runs, so what the handler calls carries it on and
    `trace.get_current_span()` lets the servicer add attributes and events.
    """

    def __init__(self, tracer: trace.Tracer, service: str) -> None:
        self._tracer = tracer
        self._service = service

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method: str = details.method
        if handler is None or method.startswith(_UNTRACED_PREFIXES) or method in _CARRIERS:
            return handler
        parent = propagate.extract({k: v for k, v in details.invocation_metadata or () if isinstance(v, str)})
        if method in _POLLS and not trace.get_current_span(parent).get_span_context().is_valid:
            return handler
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(self._unary(handler.unary_unary, method, parent), **kwargs)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(self._unary(handler.stream_unary, method, parent), **kwargs)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(self._stream(handler.unary_stream, method, parent), **kwargs)
        return grpc.stream_stream_rpc_method_handler(self._stream(handler.stream_stream, method, parent), **kwargs)

    @contextmanager
    def _span(self, method: str, parent: Context, context: aio.ServicerContext) -> Iterator[trace.Span]:
        service, _, name = method.lstrip("/").partition("/")
        attributes = {
            "rpc.system": "grpc",
            "rpc.service": service,
            "rpc.method": name,
            "turnout.service": self._service,
        }
        with self._tracer.start_as_current_span(
            f"{service}/{name}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span
            except BaseException as exc:
                # StatusInterceptor (inside this one) has already turned errors into an abort with a code.
                _end_status(span, context, cancelled=not isinstance(exc, Exception))
                raise
            _end_status(span, context, cancelled=False)

    def _unary(self, behavior: Callable[..., Awaitable[Any]], method: str, parent: Context) -> Callable[..., Any]:
        async def handler(request: Any, context: aio.ServicerContext) -> Any:
            with self._span(method, parent, context):
                return await behavior(request, context)

        return handler

    def _stream(self, behavior: Callable[..., AsyncIterator[Any]], method: str, parent: Context) -> Callable[..., Any]:
        async def handler(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
            with self._span(method, parent, context):
                async for item in behavior(request, context):
                    yield item

        return handler


def _end_status(span: trace.Span, context: aio.ServicerContext, *, cancelled: bool) -> None:
    code = grpc.StatusCode.CANCELLED if cancelled else (context.code() or grpc.StatusCode.OK)
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    if code in _SERVER_FAULTS:
        span.set_status(Status(StatusCode.ERROR, context.details() or code.name))


def server_interceptors(service: str) -> list[aio.ServerInterceptor]:
    """Interceptors for a new server of `service`: none while tracing is off."""
    tracer = tracing.tracer(service)
    return [] if tracer is None else [TracingInterceptor(tracer, service)]
