"""Prometheus metrics move as requests run: gateway /metrics on its HTTP port, the engine's,
router's and tokenizer's registries (the engine's scraped over real HTTP, as Prometheus would)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.engine.config import EngineConfig
from services.engine.model_loader import LoadedModel, load_model
from tests.telemetry.in_process import in_process_stack
from turnout.child_processes import free_port
from turnout.telemetry.metrics_http import serve_metrics

BODY = {"prompt": "Hello there", "max_tokens": 5, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    return load_model(EngineConfig(model=tiny_model_dir))


def value(text: str, name: str, **labels: str) -> float:
    """The sample `name` with these labels in a /metrics text; 0 when absent."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def text(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


async def test_counters_move_on_every_service(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    async with in_process_stack(tiny_model_dir, loaded) as stack:
        port = free_port()
        server = serve_metrics(stack.engine_metrics.registry, "127.0.0.1", port)
        try:
            engine_url = f"http://127.0.0.1:{port}/metrics"
            before_engine = httpx.get(engine_url).text
            before_gateway = (await stack.client.get("/metrics")).text
            assert value(before_engine, "turnout_engine_requests_total", finish_reason="length") == 0

            replies = await asyncio.gather(
                stack.client.post("/v1/completions", json=BODY),
                stack.client.post("/v1/completions", json={**BODY, "stream": True}),
            )
            assert [r.status_code for r in replies] == [200, 200]
            # The prompt again: its full blocks are now in the prefix cache.
            long_prompt = {**BODY, "prompt": "the same words again and again " * 8}
            for _ in range(2):
                assert (await stack.client.post("/v1/completions", json=long_prompt)).status_code == 200

            engine = httpx.get(engine_url).text
            gateway = (await stack.client.get("/metrics")).text
        finally:
            server.shutdown()

        # A stream is counted when its server side ends, which can trail the reply the gateway already
        # returned (a Detokenize stream ends after the router read its last text): wait for all four.
        def counted() -> bool:
            routed = text(stack.router.request_metrics.registry)
            tokenized = text(stack.tokenizer_metrics.registry)
            detokenized = value(tokenized, "turnout_tokenizer_requests_total", method="Detokenize", code="OK")
            return value(routed, "turnout_router_requests_total", status="OK") >= 4 and detokenized >= 4

        deadline = time.monotonic() + 30
        while not counted() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        router = text(stack.router.request_metrics.registry)
        tokenizer = text(stack.tokenizer_metrics.registry)

    # Engine: 4 requests of 5 tokens each, each with a first token and 4 gaps between tokens.
    assert value(engine, "turnout_engine_requests_total", finish_reason="length") == 4
    assert value(engine, "turnout_engine_generation_tokens_total") == 20
    assert value(engine, "turnout_engine_prompt_tokens_total") > 0
    assert value(engine, "turnout_engine_time_to_first_token_seconds_count") == 4
    assert value(engine, "turnout_engine_queue_time_seconds_count") == 4
    assert value(engine, "turnout_engine_inter_token_latency_seconds_count") == 16
    assert value(engine, "turnout_engine_e2e_request_latency_seconds_count") == 4
    assert value(engine, "turnout_engine_running_requests") == 0  # all done
    assert value(engine, "turnout_engine_kv_cache_usage_ratio") == 0
    queried = value(engine, "turnout_engine_prefix_cache_queried_tokens_total")
    hits = value(engine, "turnout_engine_prefix_cache_hit_tokens_total")
    assert queried > 0 and 0 < hits < queried  # the repeated long prompt hit

    # Gateway: two completions, one streamed; TTFT once per request, generated tokens counted.
    route = {"route": "/v1/completions", "method": "POST", "status": "200"}
    assert value(before_gateway, "turnout_gateway_requests_total", **route) == 0
    assert value(gateway, "turnout_gateway_requests_total", **route) == 4
    assert value(gateway, "turnout_gateway_requests_total", route="/metrics", method="GET", status="200") == 1
    assert value(gateway, "turnout_gateway_time_to_first_token_seconds_count") == 4
    assert value(gateway, "turnout_gateway_inter_token_latency_seconds_count") > 0
    assert value(gateway, "turnout_gateway_generation_tokens_total") == 20
    assert value(gateway, "turnout_gateway_prompt_tokens_total") > 0
    assert value(gateway, "turnout_gateway_e2e_request_latency_seconds_count", route="/v1/completions") == 4

    assert value(router, "turnout_router_requests_total", status="OK") == 4
    assert value(router, "turnout_router_time_to_first_token_seconds_count") == 4
    assert value(tokenizer, "turnout_tokenizer_requests_total", method="Encode", code="OK") == 4
    assert value(tokenizer, "turnout_tokenizer_requests_total", method="Detokenize", code="OK") == 4
    assert value(tokenizer, "turnout_tokenizer_request_duration_seconds_count", method="Encode") == 4


async def test_failed_requests_are_counted_by_status(tiny_model_dir: Path, loaded: LoadedModel) -> None:
    async with in_process_stack(tiny_model_dir, loaded) as stack:
        bad = await stack.client.post("/v1/completions", json={**BODY, "model": "no-such-model"})
        assert bad.status_code == 404
        unknown = await stack.client.get("/no/such/path")
        assert unknown.status_code == 404
        gateway = (await stack.client.get("/metrics")).text
        router = text(stack.router.request_metrics.registry)
    assert value(gateway, "turnout_gateway_requests_total", route="/v1/completions", status="404") == 1
    # Unknown paths share one label value, so a scanner cannot blow up the series count.
    assert value(gateway, "turnout_gateway_requests_total", route="unmatched", status="404") == 1
    assert value(router, "turnout_router_requests_total", status="NOT_FOUND") == 1
