"""The router's Prometheus metrics, read from the pool's live state at scrape time.

Nothing is updated on the request path except plain counters the pool keeps
anyway (ListEngines shows the same numbers), so metrics cost nothing between
scrapes and an engine that leaves the pool leaves the metrics with it.

| metric | labels | what |
| --- | --- | --- |
| `turnout_router_engine_requests_total` | engine | attempts sent to the engine |
| `turnout_router_engine_failures_total` | engine | attempts that failed with an engine fault |
| `turnout_router_engine_retries_total` | engine | attempts that failed before output and were retried elsewhere |
| `turnout_router_engine_in_flight` | engine | streams open on the engine (the router's count) |
| `turnout_router_engine_load` | engine | the load policies compare (in flight + reported beyond it) |
| `turnout_router_engine_running_requests`, `..._waiting_requests`, `..._kv_cache_usage` | engine | last GetLoad |
| `turnout_router_engine_healthy` | engine | 1 healthy, 0 starting or unhealthy |
| `turnout_router_engine_circuit_open` | engine | 1 while the circuit breaker keeps requests away |
| `turnout_router_engine_prefix_tree_tokens` | engine | prompt tokens the cache-aware policy remembers |
| `turnout_router_routing_decisions_total` | policy, reason | engines picked, by why (cache_hit, cache_miss, |
| | | imbalanced; the policy's name for the others) |
| `turnout_router_rejected_requests_total` | reason | refused before any engine: no_engine, queue_full, queue_timeout |
| `turnout_router_active_requests`, `turnout_router_queued_requests` | | admission slots held, and waiting |
| `turnout_router_requests_total` | status | Generate calls by final gRPC status (OK, CANCELLED, ...) |
| `turnout_router_time_to_first_token_seconds` | | call start to the first chunk with tokens (encode, |
| | | queueing, prefill) |
| `turnout_router_e2e_request_latency_seconds` | | call start to its end |
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from services.router.circuit_breaker import Circuit
from services.router.engine_pool import EngineClient, EnginePool
from services.router.health_checker import Health
from turnout.errors import status_of
from turnout.telemetry.metrics_http import REQUEST_LATENCY_BUCKETS, TOKEN_LATENCY_BUCKETS
from turnout.v1 import inference_pb2

PREFIX = "turnout_router"


Family = CounterMetricFamily | GaugeMetricFamily

Value = Callable[[EngineClient, EnginePool], float]
C, G = CounterMetricFamily, GaugeMetricFamily

# name, help, kind, the value for one engine
_PER_ENGINE: list[tuple[str, str, type[Family], Value]] = [
    ("engine_requests", "Attempts sent to the engine", C, lambda e, p: e.requests_total),
    ("engine_failures", "Attempts that failed with an engine fault", C, lambda e, p: e.failures_total),
    ("engine_retries", "Attempts that failed before output, retried elsewhere", C, lambda e, p: e.retried_total),
    ("engine_in_flight", "Streams open on the engine (router's count)", G, lambda e, p: e.in_flight),
    ("engine_load", "Load compared by the policies", G, lambda e, p: e.load),
    ("engine_running_requests", "Running requests (GetLoad)", G, lambda e, p: e.reported.running_requests),
    ("engine_waiting_requests", "Waiting requests (GetLoad)", G, lambda e, p: e.reported.waiting_requests),
    ("engine_kv_cache_usage", "KV cache usage 0..1 (GetLoad)", G, lambda e, p: e.reported.kv_cache_usage),
    ("engine_healthy", "1 when healthy", G, lambda e, p: float(e.health.status is Health.HEALTHY)),
    ("engine_circuit_open", "1 while the breaker is open", G, lambda e, p: float(e.breaker.state is Circuit.OPEN)),
    ("engine_prefix_tree_tokens", "Prompt tokens remembered", G, lambda e, p: p.policy.remembered_tokens(e.address)),
]


class RouterCollector(Collector):
    def __init__(self, pool: EnginePool) -> None:
        self._pool = pool

    def collect(self) -> Iterator[Family]:
        pool = self._pool
        # Scrapes run on the metrics server's thread: work on copies (list() and dict() are atomic under the GIL).
        engines = list(pool.engines)
        for name, help_text, kind, value in _PER_ENGINE:
            family = kind(f"{PREFIX}_{name}", help_text, labels=["engine"])
            for engine in engines:
                family.add_metric([engine.address], value(engine, pool))
            yield family

        decisions = CounterMetricFamily(f"{PREFIX}_routing_decisions", "Engines picked", labels=["policy", "reason"])
        for reason, count in sorted(dict(pool.decisions).items()):
            decisions.add_metric([pool.policy.name, reason], count)
        yield decisions
        rejected = CounterMetricFamily(f"{PREFIX}_rejected_requests", "Refused before any engine", labels=["reason"])
        for reason, count in sorted({**dict(pool.rejections), **dict(pool.admission.rejected)}.items()):
            rejected.add_metric([reason], count)
        yield rejected
        yield GaugeMetricFamily(f"{PREFIX}_active_requests", "Streams holding a slot", pool.admission.active)
        yield GaugeMetricFamily(f"{PREFIX}_queued_requests", "Streams waiting for a slot", pool.admission.queued)


class RequestMetrics:
    """Generate calls as the router's callers see them, counted as they pass through the servicer."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=False)
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "Generate calls by final status", ["status"], registry=r)
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Call start to first token",
            registry=r,
            buckets=TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = Histogram(
            f"{PREFIX}_e2e_request_latency_seconds", "Call start to end", registry=r, buckets=REQUEST_LATENCY_BUCKETS
        )

    async def observe(
        self, batches: AsyncIterator[list[inference_pb2.GenerateResponse]]
    ) -> AsyncIterator[list[inference_pb2.GenerateResponse]]:
        started, first, status = time.perf_counter(), True, "CANCELLED"  # left early: the caller went away
        try:
            async for batch in batches:
                if first and any(r.WhichOneof("kind") == "chunk" and r.chunk.token_ids for r in batch):
                    first = False
                    self.ttft.observe(time.perf_counter() - started)
                yield batch
            status = "OK"
        except Exception as exc:
            code = status_of(exc)
            status = code.name if code is not None else "INTERNAL"
            raise
        finally:
            self.requests.labels(status).inc()
            self.e2e.observe(time.perf_counter() - started)


def make_registry(pool: EnginePool, registry: CollectorRegistry | None = None) -> CollectorRegistry:
    registry = registry or CollectorRegistry(auto_describe=False)
    registry.register(RouterCollector(pool))
    return registry
