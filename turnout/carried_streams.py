"""What every stream carried inside another gRPC stream shares (Engine.GenerateStream,
Tokenizer.DetokenizeStream): the status it ends with and the span it is traced in.

A carried stream answers exactly as its own call would, so it ends with the status that call would
have ended with (`set_end`: the one place an error becomes a `StreamEnd`, as `StatusInterceptor` is
for calls), and is traced as that call would be: a SERVER span named after the call, child of the
trace context the caller put in the request (the carrier's metadata belongs to no one request).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping

import grpc
from grpc import aio
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Status, StatusCode

from turnout.errors import status_of
from turnout.telemetry import tracing
from turnout.v1 import common_pb2

log = logging.getLogger(__name__)

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
