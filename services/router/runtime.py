"""Everything the router process runs around its gRPC services, wired together.

    engines (EnginePool) ◀── discovery (targets, DNS) ── RouterAdmin
        ▲   ▲
        │   └── health checker (grpc.health.v1, interval) and load poller (GetLoad)
        └────── Inference.Generate → dispatch (admission, policy, retries)

`main.py` serves it; tests build one in-process around fake engines.
"""

from __future__ import annotations

import asyncio
from wsgiref.simple_server import WSGIServer

from services.router.admin_service import RouterAdminServicer
from services.router.config import RouterConfig
from services.router.engine_discovery import EngineDiscovery, Resolver, resolve_dns
from services.router.engine_pool import EnginePool
from services.router.health_checker import HealthChecker
from services.router.load_poller import LoadPoller
from services.router.metrics import RequestMetrics, make_registry
from services.router.service import InferenceServicer
from services.router.stack_metrics import StackMetrics
from services.router.tokenizer_pool import TokenizerPool
from turnout.grpc_server import ServiceSpec
from turnout.telemetry.gc_metrics import register_gc_pauses
from turnout.telemetry.metrics_http import serve_metrics
from turnout.telemetry.metrics_service import metrics_spec
from turnout.v1 import inference_pb2, inference_pb2_grpc, router_admin_pb2, router_admin_pb2_grpc


class RouterRuntime:
    def __init__(self, config: RouterConfig, resolver: Resolver = resolve_dns) -> None:
        self.config = config
        self.engines = EnginePool(config)
        self.tokenizers = TokenizerPool(config.tokenizers, config.security.client, config.tokenizer_ready_timeout_s)
        self.discovery = EngineDiscovery(self.engines, config.dns_refresh_interval_s, resolver)
        self.health = HealthChecker(self.engines, config.health_check_interval_s, config.health_check_timeout_s)
        self.load = LoadPoller(self.engines, config.load_poll_interval_s, config.health_check_timeout_s)
        self._metrics_server: WSGIServer | None = None
        self.request_metrics = RequestMetrics()
        # The router's own series: what --metrics-port serves, and the first part of Metrics.Scrape.
        self.registry = make_registry(self.engines, self.request_metrics.registry)
        register_gc_pauses(self.registry, "router")
        self.inference = InferenceServicer(
            self.engines, self.tokenizers, self.request_metrics, log_requests=config.enable_log_requests
        )

    async def start(self) -> None:
        for target in self.config.engines:
            await self.discovery.add(target)
        self.discovery.start()
        self.health.start()
        self.load.start()
        if self.config.metrics_port is not None:
            self._metrics_server = serve_metrics(self.registry, self.config.host, self.config.metrics_port)

    def services(self) -> list[ServiceSpec]:
        inference = self.inference
        admin = RouterAdminServicer(self.engines, self.discovery)
        stack = StackMetrics(self.registry, self.engines, self.tokenizers)
        return [
            metrics_spec(stack),
            ServiceSpec(
                name=inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name,
                add=lambda server: inference_pb2_grpc.add_InferenceServicer_to_server(inference, server),
            ),
            ServiceSpec(
                name=router_admin_pb2.DESCRIPTOR.services_by_name["RouterAdmin"].full_name,
                add=lambda server: router_admin_pb2_grpc.add_RouterAdminServicer_to_server(admin, server),
            ),
        ]

    def drain(self) -> None:
        self.inference.drain()

    async def close(self) -> None:
        await self.discovery.close()
        await self.health.close()
        await self.load.close()
        if self._metrics_server is not None:
            await asyncio.to_thread(self._metrics_server.shutdown)
        await self.engines.close()
        await self.tokenizers.close()
