"""All four services in one process: real grpc.aio servers on loopback (built by `make_server`, so
with the interceptors a real service gets), and the gateway app driven through httpx's ASGI
transport. Tracing is whatever `turnout.telemetry.tracing` says when the stack is built."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from gateway.app import create_app
from gateway.config import GatewayConfig
from services.engine.config import EngineConfig
from services.engine.engine_loop import EngineLoop
from services.engine.llm_engine import LLMEngine
from services.engine.model_loader import LoadedModel
from services.engine.service import EngineServicer
from services.router.config import RouterConfig
from services.router.runtime import RouterRuntime
from services.tokenizer.service import TokenizerServicer
from services.tokenizer.text_tokenizer import TextTokenizer
from turnout.grpc_server import make_server
from turnout.telemetry.engine_metrics import EngineMetrics
from turnout.telemetry.metrics_service import RegistryMetrics, metrics_spec
from turnout.telemetry.rpc_metrics import RpcMetrics
from turnout.v1 import engine_pb2_grpc, tokenizer_pb2_grpc


@dataclass
class InProcessStack:
    client: httpx.AsyncClient
    engine: EngineLoop
    engine_metrics: EngineMetrics
    tokenizer_metrics: RpcMetrics
    router: RouterRuntime


async def _start(server: aio.Server) -> str:
    """Start with the standard health service SERVING, as `turnout.grpc_server.serve` does."""
    checks = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checks, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await checks.set("", health_pb2.HealthCheckResponse.SERVING)
    return f"127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def in_process_stack(model_dir: Path, loaded: LoadedModel) -> AsyncIterator[InProcessStack]:
    engine_metrics = EngineMetrics(model_name=model_dir.name)
    engine = EngineLoop(LLMEngine(EngineConfig(model=model_dir, num_kv_blocks=128), loaded), metrics=engine_metrics)
    engine_server = make_server("engine")
    servicer = EngineServicer(loaded, engine, engine.engine.config)
    engine_pb2_grpc.add_EngineServicer_to_server(servicer, engine_server)
    metrics_spec(RegistryMetrics(engine_metrics.registry)).add(engine_server)
    engine_address = await _start(engine_server)

    tokenizer_metrics = RpcMetrics("tokenizer")
    tokenizer_server = make_server("tokenizer", [tokenizer_metrics])
    tokenizer_servicer = TokenizerServicer(TextTokenizer(model_dir), carried_metrics=tokenizer_metrics)
    tokenizer_pb2_grpc.add_TokenizerServicer_to_server(tokenizer_servicer, tokenizer_server)
    metrics_spec(RegistryMetrics(tokenizer_metrics.registry)).add(tokenizer_server)
    tokenizer_address = await _start(tokenizer_server)

    config = RouterConfig(
        engines=(engine_address,), tokenizers=(tokenizer_address,), health_check_interval_s=0.1, load_poll_interval_s=0
    )
    router = RouterRuntime(config)
    await router.start()
    router_server = make_server("router")
    for spec in router.services():
        spec.add(router_server)
    router_address = await _start(router_server)
    for _ in range(200):
        if router.engines.models():
            break
        await asyncio.sleep(0.05)
    assert router.engines.models(), "the router never saw the engine healthy"

    app = create_app(GatewayConfig(router_address=router_address))
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=60) as client:
                yield InProcessStack(client, engine, engine_metrics, tokenizer_metrics, router)
    finally:
        await router_server.stop(0)
        await router.close()
        await tokenizer_server.stop(0)
        await tokenizer_servicer.close()
        await engine_server.stop(0)
        await asyncio.to_thread(engine.shutdown)
