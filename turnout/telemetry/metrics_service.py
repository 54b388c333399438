"""`turnout.v1.Metrics`: a service's Prometheus page over gRPC, and asking another service for its.

The engine and the tokenizer serve their registry this way (beside their optional HTTP
`--metrics-port`); the router serves its own page plus every engine's and tokenizer's
(services/router/stack_metrics.py), and the gateway puts the router's into its `/metrics`.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc import aio
from prometheus_client import CollectorRegistry, generate_latest

from turnout.grpc_server import ServiceSpec
from turnout.v1 import metrics_pb2, metrics_pb2_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = metrics_pb2.DESCRIPTOR.services_by_name["Metrics"].full_name


class RegistryMetrics(metrics_pb2_grpc.MetricsServicer):
    """Serves one registry's page."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    async def Scrape(
        self, request: metrics_pb2.ScrapeRequest, context: aio.ServicerContext
    ) -> metrics_pb2.ScrapeResponse:
        # Collectors read live state (the engine's scheduler gauges): off the event loop, as the
        # HTTP endpoint's own thread would.
        text = await asyncio.to_thread(generate_latest, self._registry)
        return metrics_pb2.ScrapeResponse(text=text.decode())


def metrics_spec(servicer: metrics_pb2_grpc.MetricsServicer) -> ServiceSpec:
    return ServiceSpec(
        name=SERVICE_NAME, add=lambda server: metrics_pb2_grpc.add_MetricsServicer_to_server(servicer, server)
    )


async def scrape(channel: aio.Channel, timeout_s: float, backend_timeout_s: float = 0.0) -> str | None:
    """The page of the service on `channel`, or None when it does not answer within `timeout_s`
    (down, hung, or too old to serve Metrics)."""
    stub = metrics_pb2_grpc.MetricsStub(channel)
    try:
        reply = await stub.Scrape(metrics_pb2.ScrapeRequest(backend_timeout_s=backend_timeout_s), timeout=timeout_s)
    except grpc.RpcError as exc:
        code = exc.code() if isinstance(exc, aio.AioRpcError) else None
        log.debug("scrape failed", extra={"code": code.name if code else str(exc)})
        return None
    return str(reply.text)
