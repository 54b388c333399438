"""Running a Turnout gRPC service: health, reflection, status mapping, tracing, metrics,
graceful shutdown.

Every service builds its servicers and calls `serve()`; this is the only place
that knows how a server starts and stops, and (with `client_channel`) the only
place channels and servers get their interceptors and credentials (turnout/grpc_auth.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import CollectorRegistry

from turnout import grpc_auth
from turnout.errors import StatusInterceptor
from turnout.gc_heap import freeze_startup_heap
from turnout.security import ClientCredentials, ServiceSecurity
from turnout.telemetry.grpc_tracing import server_interceptors, traced
from turnout.telemetry.metrics_http import serve_metrics

log = logging.getLogger(__name__)

# Messages of a few MB (long prompts as token ids, chat histories) must pass.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # A restarted service (same address) is reconnected within two seconds, not after gRPC's
    # default exponential backoff (up to two minutes) has run its course.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
]
# Calls that arrived and that the Python server has not picked up yet. gRPC core cancels
# calls (CANCELLED) at random once its backlog passes 1000 (its default), before our own
# admission control sees them: a burst like one batch of 2000 prompts lost ~7% that way.
# The backlog must hold what the router admits and queues (--max-concurrent-requests +
# --max-queued-requests, 2048 by default); it is refused with RESOURCE_EXHAUSTED there.
MAX_PENDING_CALLS = 4096
SERVER_OPTIONS = [
    *CHANNEL_OPTIONS,
    ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
    ("grpc.server.max_pending_requests_hard_limit", 2 * MAX_PENDING_CALLS),
]


@dataclass(frozen=True)
class ServiceSpec:
    """One servicer to mount: its full name (for health and reflection) and how to add it."""

    name: str
    add: Callable[[aio.Server], None]


@dataclass(frozen=True)
class MetricsEndpoint:
    """Where a service serves its Prometheus registry over HTTP (`/metrics`)."""

    registry: CollectorRegistry
    host: str
    port: int


def client_channel(
    address: str,
    credentials: ClientCredentials | None = None,
    options: Sequence[tuple[str, int]] = CHANNEL_OPTIONS,
) -> aio.Channel:
    """A client channel with the message limits every Turnout server accepts, presenting
    `credentials` (TLS, and the bearer on every call); it carries the trace context of each call
    while tracing is on."""
    return traced(grpc_auth.async_channel(address, credentials, list(options)))


def make_server(
    service: str, interceptors: Sequence[aio.ServerInterceptor] = (), security: ServiceSecurity | None = None
) -> aio.Server:
    """A server that first refuses calls without the credential `security` asks for, whose calls
    then get a span when tracing is on, pass `interceptors`, and whose errors become status codes.
    StatusInterceptor is innermost, so the others see the final status."""
    auth = grpc_auth.server_interceptors(security) if security is not None else []
    chain = [*auth, *server_interceptors(service), *interceptors, StatusInterceptor()]
    return aio.server(interceptors=chain, options=SERVER_OPTIONS)


async def serve(
    address: str,
    services: Sequence[ServiceSpec],
    *,
    service: str = "turnout",
    interceptors: Sequence[aio.ServerInterceptor] = (),
    grace_s: float = 5.0,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    on_drain: Callable[[], None] | None = None,
    metrics: MetricsEndpoint | None = None,
    security: ServiceSecurity | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then stop accepting calls and drain for `grace_s`.
    `security`: the credentials calls need and TLS (None: open, plaintext; in-process tests).
    `on_drain` runs as the stop begins (health NOT_SERVING), so that streams a caller keeps open for
    many requests can refuse new ones and end once idle; `on_stop` runs once the server has stopped."""
    server = make_server(service, interceptors, security)
    for spec in services:
        spec.add(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [spec.name for spec in services]
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)

    tls = security.tls if security is not None else None
    if tls is not None and tls.serves_tls:
        port = server.add_secure_port(address, tls.server_credentials())
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind gRPC server to {address}")
    await server.start()
    freeze_startup_heap()  # the service is built: what is alive now lives as long as the process
    metrics_server = None
    if metrics is not None:
        metrics_server = serve_metrics(metrics.registry, metrics.host, metrics.port)
        log.info("metrics", extra={"url": f"http://{metrics.host}:{metrics_server.server_port}/metrics"})
    for name in ["", *names]:
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("serving", extra={"address": address, "services": names})

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()

    log.info("shutting down", extra={"grace_s": grace_s})
    await health_servicer.enter_graceful_shutdown()
    if on_drain is not None:  # long-lived streams wind down within the grace period
        on_drain()
    await server.stop(grace_s)
    if on_stop is not None:
        await on_stop()
    if metrics_server is not None:
        await asyncio.to_thread(metrics_server.shutdown)
    log.info("stopped")


async def wait_healthy(
    address: str, timeout_s: float, service: str = "", credentials: ClientCredentials | None = None
) -> None:
    """Poll the standard health service at `address` until it reports SERVING."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with client_channel(address, credentials) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{address} not healthy after {timeout_s:.0f}s")
            await asyncio.sleep(0.2)
