"""The FastAPI application: routes, error handlers, and one gRPC channel to the router."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig

from gateway import engines_api, metrics, native_api, openai_api
from gateway.config import GatewayConfig
from gateway.errors import install_handlers
from gateway.router_client import RouterClient
from turnout import __version__
from turnout.grpc_server import insecure_channel


def create_app(config: GatewayConfig) -> FastAPI:
    """The gateway app; its lifespan opens the router channel and closes it on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The channel connects lazily: the gateway starts even when the router
        # is not up yet (/health says 503 until it is).
        channel = insecure_channel(config.router_address)
        app.state.router = RouterClient.on_channel(channel, config.request_timeout_s)
        try:
            yield
        finally:
            await channel.close()

    # FastAPI's own OpenTelemetry support stays off: `metrics.Observability` makes the one span and
    # the metrics of each request (FastAPI's would add a second SERVER span once a global tracer
    # provider exists, and would configure exporters from OTEL_* on its own).
    off: TelemetryConfig = {
        "tracing": False,
        "metrics": False,
        "logs": False,
        "operation_spans": False,
        "auto_configure": False,
    }
    app = FastAPI(title="Turnout gateway", version=__version__, lifespan=lifespan, telemetry=off)
    app.state.config = config
    # Reported as every model's `created`: the contract has no creation time.
    app.state.created = int(time.time())
    install_handlers(app)
    app.state.metrics = metrics.GatewayMetrics()
    app.add_middleware(metrics.Observability, metrics=app.state.metrics)
    app.include_router(metrics.router)
    app.include_router(openai_api.router)
    app.include_router(native_api.router)
    app.include_router(engines_api.router)
    return app
