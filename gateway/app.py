"""The FastAPI application: routes, error handlers, and one gRPC channel to the router."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import Depends, FastAPI
from fastapi.telemetry import TelemetryConfig
from starlette.middleware.cors import CORSMiddleware

from gateway import (
    audio_api,
    embeddings_api,
    engines_api,
    invocations_api,
    lora_api,
    metrics,
    native_api,
    openai_api,
    responses_api,
    score_api,
    server_api,
    tokenize_api,
)
from gateway.config import GatewayConfig
from gateway.errors import install_handlers
from gateway.middleware import ApiKeyMiddleware, BodySizeLimitMiddleware, RootPathMiddleware
from gateway.request_id import RequestIdMiddleware
from gateway.responses_store import ResponseStore, SharedResponseStore
from gateway.router_client import RouterClient
from gateway.text_validity import refuse_invalid_text
from turnout import __version__
from turnout.grpc_server import client_channel
from turnout.telemetry.gc_metrics import register_gc_pauses


def create_app(config: GatewayConfig) -> FastAPI:
    """The gateway app; its lifespan opens the router channel and closes it on shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The channel connects lazily: the gateway starts even when the router
        # is not up yet (/health says 503 until it is).
        channel = client_channel(config.router_address, config.security.client)
        app.state.router = RouterClient.on_channel(
            channel,
            config.request_timeout_s,
            config.served_model_names,
            address=config.router_address,
            ready_timeout_s=config.router_ready_timeout_s,
        )
        try:
            yield
        finally:
            await app.state.router.close()
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
    # Every route's JSON body is checked for invalid Unicode before its model sees it.
    app = FastAPI(
        title="Turnout gateway",
        version=__version__,
        lifespan=lifespan,
        telemetry=off,
        dependencies=[Depends(refuse_invalid_text)],
    )
    app.state.config = config
    app.state.responses = (
        SharedResponseStore(Path(config.responses_store_file), config.responses_store_size)
        if config.responses_store_file
        else ResponseStore(config.responses_store_size)
    )
    install_handlers(app)
    app.state.metrics = metrics.GatewayMetrics()
    register_gc_pauses(app.state.metrics.registry, "gateway")
    app.add_middleware(metrics.Observability, metrics=app.state.metrics)
    app.include_router(metrics.router)
    app.include_router(openai_api.router)
    app.include_router(responses_api.router)
    app.include_router(native_api.router)
    app.include_router(engines_api.router)
    app.include_router(tokenize_api.router)
    app.include_router(server_api.router)
    app.include_router(lora_api.router)
    app.include_router(embeddings_api.router)
    app.include_router(score_api.router)
    app.include_router(invocations_api.router)
    app.include_router(audio_api.router)
    # The last added runs first: CORS answers preflights before the key is checked, the
    # size limit applies to authenticated requests only, and every response gets its id.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=config.max_request_bytes)
    security = config.security
    if security.api_keys:
        # The admin key opens what an API key opens (its routes need it in the same header).
        keys = [*security.api_keys, *([security.admin_key] if security.admin_key else [])]
        app.add_middleware(ApiKeyMiddleware, keys=keys)
    app.add_middleware(
        CORSMiddleware,
        allow_origins=config.allowed_origins,
        allow_methods=config.allowed_methods,
        allow_headers=config.allowed_headers,
        allow_credentials=config.allow_credentials,
    )
    app.add_middleware(RequestIdMiddleware)
    if config.root_path:
        app.add_middleware(RootPathMiddleware, root_path=config.root_path)
    return app
