"""Calls and their latency per gRPC method, as a server interceptor (the tokenizer's metrics).

| metric | labels | what |
| --- | --- | --- |
| `turnout_<service>_requests_total` | method, code | finished calls by status code (OK, INVALID_ARGUMENT, ...) |
| `turnout_<service>_request_duration_seconds` | method | call start to end; for Detokenize, the whole stream |

Health checks and reflection are not counted.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from grpc import aio
from prometheus_client import CollectorRegistry, Counter, Histogram

from turnout.telemetry.metrics_http import REQUEST_LATENCY_BUCKETS

_UNCOUNTED_PREFIXES = ("/grpc.health.v1.", "/grpc.reflection.")


class RpcMetrics(aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, service: str, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        prefix = f"turnout_{service}"
        self.requests = Counter(
            f"{prefix}_requests", "Finished calls by method and status", ["method", "code"], registry=self.registry
        )
        self.duration = Histogram(
            f"{prefix}_request_duration_seconds",
            "Call duration by method",
            ["method"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, *REQUEST_LATENCY_BUCKETS),
        )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(_UNCOUNTED_PREFIXES):
            return handler
        method = details.method.rpartition("/")[2]
        kwargs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(self._unary(handler.unary_unary, method), **kwargs)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(self._unary(handler.stream_unary, method), **kwargs)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(self._stream(handler.unary_stream, method), **kwargs)
        return grpc.stream_stream_rpc_method_handler(self._stream(handler.stream_stream, method), **kwargs)

    def record(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        """One finished call of `method` (a name such as "Detokenize"); also for calls carried inside
        another stream (services/tokenizer/detokenize_streams.py, encode_streams.py), which count as the calls
        they stand for."""
        self.requests.labels(method, code.name).inc()
        self.duration.labels(method).observe(seconds)

    def _record(self, method: str, started: float, context: aio.ServicerContext, cancelled: bool) -> None:
        code = grpc.StatusCode.CANCELLED if cancelled else (context.code() or grpc.StatusCode.OK)
        self.record(method, code, time.perf_counter() - started)

    def _unary(self, behavior: Callable[..., Awaitable[Any]], method: str) -> Callable[..., Any]:
        async def handler(request: Any, context: aio.ServicerContext) -> Any:
            started, cancelled = time.perf_counter(), True
            try:
                result = await behavior(request, context)
                cancelled = False
                return result
            except Exception:
                cancelled = False  # an abort: the context holds its code
                raise
            finally:
                self._record(method, started, context, cancelled)

        return handler

    def _stream(self, behavior: Callable[..., AsyncIterator[Any]], method: str) -> Callable[..., Any]:
        async def handler(request: Any, context: aio.ServicerContext) -> AsyncIterator[Any]:
            started, cancelled = time.perf_counter(), True
            try:
                async for item in behavior(request, context):
                    yield item
                cancelled = False
            except Exception:
                cancelled = False
                raise
            finally:
                self._record(method, started, context, cancelled)

        return handler
