"""The gateway's /metrics as the whole stack's page: vLLM's names beside ours, every service's
series labelled by where they came from, and a dead or hung service costing only its own part."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from grpc import aio
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway import metrics as gateway_metrics
from gateway.app import create_app
from gateway.config import GatewayConfig
from services.engine.config import EngineConfig
from services.engine.model_loader import LoadedModel, load_model
from services.engine.request import EngineOutput, Finish
from services.router import stack_metrics
from services.router.config import RouterConfig
from services.router.runtime import RouterRuntime
from tests.telemetry.in_process import in_process_stack
from turnout.telemetry import exposition
from turnout.telemetry.engine_metrics import EngineGauges, EngineMetrics, RequestTimeline
from turnout.telemetry.metrics_service import RegistryMetrics, metrics_spec, scrape
from turnout.telemetry.vllm_names import VLLM_NAMES
from turnout.v1 import metrics_pb2, metrics_pb2_grpc

BODY = {"prompt": "Hello there", "max_tokens": 5, "temperature": 0, "ignore_eos": True}


def value(text: str, name: str, **labels: str) -> float:
    """The sample `name` with these labels on a page; 0 when absent."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def types(text: str) -> dict[str, str]:
    return {family.name: family.type for family in text_string_to_metric_families(text)}


# -- vLLM's names -----------------------------------------------------------------------------


def test_vllm_names_carry_the_engine_values_with_vllm_types_and_labels() -> None:
    metrics = EngineMetrics(model_name="tiny")
    metrics.watch(lambda: EngineGauges(3, 2, 0.25, prefix_queried_tokens=40, prefix_hit_tokens=16, preemptions=1))
    timeline = RequestTimeline(queued_ns=0)
    metrics.on_scheduled(timeline, 1_000_000)
    for step, now_ns in enumerate((20_000_000, 30_000_000, 45_000_000)):
        last = step == 2
        output = EngineOutput(
            [step], prompt_tokens=7, completion_tokens=step + 1, finish=Finish("length") if last else None
        )
        output.request_finished = last
        metrics.on_step(now_ns - 5_000_000, now_ns, [(timeline, output)])
    page = generate_latest(metrics.registry).decode()
    m = {"model_name": "tiny"}

    assert value(page, "vllm:num_requests_running", **m) == value(page, "turnout_engine_running_requests") == 3
    assert value(page, "vllm:num_requests_waiting", **m) == 2
    assert value(page, "vllm:kv_cache_usage_perc", **m) == 0.25  # a share, 0..1, as vLLM's
    assert value(page, "vllm:prompt_tokens_total", **m) == value(page, "turnout_engine_prompt_tokens_total") == 7
    assert value(page, "vllm:generation_tokens_total", **m) == 3
    assert value(page, "vllm:request_success_total", finished_reason="length", **m) == 1
    assert value(page, "vllm:prefix_cache_queries_total", **m) == 40
    assert value(page, "vllm:prefix_cache_hits_total", **m) == 16
    assert value(page, "vllm:num_preemptions_total", **m) == value(page, "turnout_engine_preemptions_total") == 1
    for name in ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"):
        assert value(page, f"{name}_count", **m) == 2
        assert value(page, f"{name}_bucket", le="0.02", **m) == 2  # gaps of 10 and 15 ms
    assert value(page, "vllm:time_to_first_token_seconds_sum", **m) == pytest.approx(0.02)
    assert value(page, "vllm:e2e_request_latency_seconds_count", **m) == 1
    assert value(page, "vllm:request_queue_time_seconds_sum", **m) == pytest.approx(0.001)

    kinds = types(page)
    for ours, theirs in VLLM_NAMES.items():
        for name in theirs:
            assert kinds[name] == kinds[ours], name  # every alias is on the page, typed as ours
    assert kinds["vllm:num_requests_running"] == "gauge"
    assert kinds["vllm:generation_tokens"] == "counter"
    assert kinds["vllm:time_to_first_token_seconds"] == "histogram"


def test_both_names_come_from_one_read_per_scrape() -> None:
    """A page never shows the two name sets a step apart: the state is read once per scrape."""
    reads = iter(range(1, 1000))

    def gauges() -> EngineGauges:
        n = next(reads)  # the scheduler moves on between any two reads
        return EngineGauges(n, n, 0.0, prefix_queried_tokens=n, prefix_hit_tokens=n, preemptions=n)

    metrics = EngineMetrics(model_name="tiny")
    metrics.watch(gauges)
    page = generate_latest(metrics.registry).decode()
    assert value(page, "vllm:num_requests_running") == value(page, "turnout_engine_running_requests") == 1
    assert value(page, "vllm:num_preemptions_total") == value(page, "turnout_engine_preemptions_total") == 1


# -- merging pages ----------------------------------------------------------------------------


def _page(name: str, amount: float, **labels: str) -> str:
    registry = CollectorRegistry()
    counter = Counter(name, "help", list(labels), registry=registry)
    (counter.labels(**labels) if labels else counter).inc(amount)
    return generate_latest(registry).decode()


def test_pages_merge_into_one_family_per_name_with_origin_labels() -> None:
    first = exposition.parse(_page("turnout_engine_generation_tokens", 5), {"engine": "a:1"})
    # A label the service already had under the name we add is kept, as `exported_<name>`.
    second = exposition.parse(_page("turnout_engine_generation_tokens", 7, engine="inner"), {"engine": "b:2"})
    page = exposition.render(exposition.merge([first, second])).decode()

    assert page.count("# TYPE turnout_engine_generation_tokens_total counter") == 1
    assert value(page, "turnout_engine_generation_tokens_total", engine="a:1") == 5
    assert value(page, "turnout_engine_generation_tokens_total", engine="b:2", exported_engine="inner") == 7


# -- a dead or hung service -------------------------------------------------------------------


class _Hung(metrics_pb2_grpc.MetricsServicer):
    async def Scrape(
        self, request: metrics_pb2.ScrapeRequest, context: aio.ServicerContext
    ) -> metrics_pb2.ScrapeResponse:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


async def _server(servicer: metrics_pb2_grpc.MetricsServicer) -> tuple[aio.Server, str]:
    server = aio.server()
    metrics_spec(servicer).add(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def servers() -> AsyncIterator[dict[str, str]]:
    """A healthy engine page, a hung engine, a dead engine address, and a healthy tokenizer page."""
    healthy = CollectorRegistry()
    Counter("turnout_engine_generation_tokens", "tokens", registry=healthy).inc(11)
    tokenizer = CollectorRegistry()
    Counter("turnout_tokenizer_requests", "calls", registry=tokenizer).inc(2)
    started = [
        await _server(RegistryMetrics(healthy)),
        await _server(_Hung()),
        await _server(RegistryMetrics(tokenizer)),
    ]
    dead_server, dead = await _server(_Hung())
    await dead_server.stop(0)  # nothing listens there any more
    try:
        yield {"engine": started[0][1], "hung": started[1][1], "tokenizer": started[2][1], "dead": dead}
    finally:
        for server, _ in started:
            await server.stop(0)


async def test_a_hung_or_dead_service_costs_only_its_series(
    servers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stack_metrics, "BACKEND_TIMEOUT_S", 0.5)
    config = RouterConfig(
        engines=(servers["engine"], servers["hung"], servers["dead"]),
        tokenizers=(servers["tokenizer"],),
        health_check_interval_s=60,
        load_poll_interval_s=0,
    )
    router = RouterRuntime(config)
    await router.start()
    server = aio.server()
    for spec in router.services():
        spec.add(server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        async with aio.insecure_channel(address) as channel:
            started = time.monotonic()
            page = await scrape(channel, timeout_s=10)
            elapsed = time.monotonic() - started
    finally:
        await server.stop(0)
        await router.close()

    assert page is not None
    assert elapsed < 2.0  # the hung engine's deadline (0.5 s), not its hour
    up = "turnout_scrape_up"
    assert value(page, up, service="engine", address=servers["engine"]) == 1
    assert value(page, up, service="engine", address=servers["hung"]) == 0
    assert value(page, up, service="engine", address=servers["dead"]) == 0
    assert value(page, up, service="tokenizer", address=servers["tokenizer"]) == 1
    assert value(page, "turnout_engine_generation_tokens_total", engine=servers["engine"]) == 11
    assert value(page, "turnout_tokenizer_requests_total", tokenizer=servers["tokenizer"]) == 2
    # The router's own series are there whatever the others did.
    assert "turnout_router_engine_healthy" in types(page)


async def test_gateway_metrics_answer_when_the_router_hangs(
    servers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway_metrics, "ROUTER_SCRAPE_TIMEOUT_S", 0.5)
    for router in (servers["hung"], servers["dead"]):
        app = create_app(GatewayConfig(router_address=router))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
                started = time.monotonic()
                reply = await client.get("/metrics")
                elapsed = time.monotonic() - started
        assert reply.status_code == 200
        assert elapsed < 2.0
        assert value(reply.text, "turnout_scrape_up", service="router", address=router) == 0
        assert "turnout_gateway_requests" in types(reply.text)


# -- the real stack, in one process ------------------------------------------------------------


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=tiny_model_dir))


async def test_gateway_page_carries_every_service_under_both_names(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    async with in_process_stack(tiny_model_dir, loaded) as stack:
        before = (await stack.client.get("/metrics")).text
        reply = await stack.client.post("/v1/completions", json=BODY)
        assert reply.status_code == 200
        after = (await stack.client.get("/metrics")).text
        engine = stack.router.engines.engines[0].address

    e = {"engine": engine, "model_name": tiny_model_dir.name}
    generated = value(after, "vllm:generation_tokens_total", **e) - value(before, "vllm:generation_tokens_total", **e)
    assert generated == 5
    assert value(after, "turnout_engine_generation_tokens_total", engine=engine) == value(
        after, "vllm:generation_tokens_total", **e
    )
    assert value(after, "vllm:request_success_total", finished_reason="length", **e) == 1
    assert value(after, "vllm:time_to_first_token_seconds_count", **e) == 1
    assert value(after, "vllm:e2e_request_latency_seconds_count", **e) == 1
    assert value(after, "vllm:prompt_tokens_total", **e) > 0
    assert value(after, "turnout_router_engine_requests_total", engine=engine) == 1
    assert value(after, "turnout_gateway_generation_tokens_total") == 5
    kinds = types(after)
    assert "turnout_tokenizer_requests" in kinds and "turnout_tokenizer_request_duration_seconds" in kinds
    assert value(after, "turnout_scrape_up", service="engine", address=engine) == 1
    assert value(after, "turnout_scrape_up", service="router") == 1
