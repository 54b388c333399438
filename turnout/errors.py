"""Errors every service raises, and the one place they become gRPC status codes.

Servicers raise `TurnoutError` subclasses; `StatusInterceptor` turns them into
the matching status with the message intact. Anything else is a bug: it is
logged with its traceback and the caller sees INTERNAL with a short message,
never the traceback.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio

from turnout.request_decoding import UndecodableRequest, lenient

log = logging.getLogger(__name__)


class TurnoutError(Exception):
    """An error a caller can act on; `code` is the gRPC status it maps to."""

    code = grpc.StatusCode.INTERNAL


class InvalidArgument(TurnoutError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(TurnoutError):
    code = grpc.StatusCode.NOT_FOUND


class Unavailable(TurnoutError):
    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(TurnoutError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(TurnoutError):
    code = grpc.StatusCode.FAILED_PRECONDITION


async def _abort(context: aio.ServicerContext, exc: BaseException, method: str) -> None:
    if isinstance(exc, TurnoutError):
        await context.abort(exc.code, str(exc))
    if isinstance(exc, aio.AioRpcError):
        # A downstream service's status passes through unchanged: its message already says what is wrong.
        await context.abort(exc.code(), exc.details() or exc.code().name)
    log.exception("unhandled error in %s", method, exc_info=exc)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}")


def _wrap_unary(behavior: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Awaitable[Any]]:
    async def handler(request: Any, context: aio.ServicerContext) -> Any:
        try:
            return await behavior(_checked(request), context)
        except aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc, method)

    return handler


def _wrap_stream(behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    if not inspect.isasyncgenfunction(behavior):
        # A coroutine that answers through context.write (grpcio's Health.Watch): awaited, not iterated.
        return _wrap_unary(behavior, method)
    return _wrap_stream_generator(behavior, method)


def _wrap_stream_generator(
    behavior: Callable[..., AsyncIterator[Any]], method: str
) -> Callable[..., AsyncIterator[Any]]:
    async def handler(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
        try:
            async for item in behavior(_checked(request), context):
                yield item
        except aio.AbortError:
            raise
        except Exception as exc:
            await _abort(context, exc, method)

    return handler


def _checked(request: Any) -> Any:
    """The request, or for a request stream the stream; a request that did not parse is INVALID_ARGUMENT."""
    if isinstance(request, UndecodableRequest):
        raise InvalidArgument(request.message)
    if hasattr(request, "__aiter__"):
        return _checked_stream(request)
    return request


async def _checked_stream(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, UndecodableRequest):
            raise InvalidArgument(request.message)
        yield request


class StatusInterceptor(aio.ServerInterceptor):  # type: ignore[misc]
    """Maps exceptions raised by any handler to gRPC status codes; a request that does not parse
    (invalid UTF-8 in a string field) is INVALID_ARGUMENT naming the field (`request_decoding`)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        method = handler_call_details.method
        deserialize = handler.request_deserializer
        kwargs = {
            "request_deserializer": lenient(deserialize) if deserialize is not None else None,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(_wrap_unary(handler.unary_unary, method), **kwargs)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_wrap_unary(handler.stream_unary, method), **kwargs)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(_wrap_stream(handler.unary_stream, method), **kwargs)
        return grpc.stream_stream_rpc_method_handler(_wrap_stream(handler.stream_stream, method), **kwargs)


def status_of(exc: BaseException) -> grpc.StatusCode | None:
    """The status code carried by an error from a gRPC call, if it is one."""
    if isinstance(exc, aio.AioRpcError):
        return exc.code()
    if isinstance(exc, TurnoutError):
        return exc.code
    return None
