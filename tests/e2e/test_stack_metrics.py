"""`turnout serve`'s gateway /metrics is the whole stack's page: engine series under our names
and vLLM's, router and tokenizer series, all moving with a request; and every series the Grafana
dashboard queries is on it."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.stack import Stack
from tests.grafana_queries import exposed_names, load_dashboard, metric_names, queries

BODY = {"prompt": "Hello there", "max_tokens": 5, "temperature": 0, "ignore_eos": True}


def page(stack: Stack) -> str:
    reply = httpx.get(f"{stack.base_url}/metrics", timeout=30)
    assert reply.status_code == 200
    return reply.text


def total(text: str, name: str, **labels: str) -> float:
    """The sum of the samples `name` with these labels (over every engine, say)."""
    return sum(
        float(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def labelled(text: str, name: str, label: str) -> set[str]:
    """The values of `label` on the samples `name`."""
    return {
        sample.labels[label]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and label in sample.labels
    }


def test_gateway_page_carries_every_service_under_both_names(tiny_stack: Stack) -> None:
    before = page(tiny_stack)
    reply = httpx.post(f"{tiny_stack.base_url}/v1/completions", json=BODY, timeout=120)
    assert reply.status_code == 200
    model = reply.json()["model"]
    after = page(tiny_stack)

    engine = f"127.0.0.1:{tiny_stack.engine_port}"
    e = {"engine": engine, "model_name": model}
    for name in ("vllm:generation_tokens_total", "turnout_engine_generation_tokens_total"):
        assert total(after, name, engine=engine) - total(before, name, engine=engine) == 5, name
    assert total(after, "vllm:generation_tokens_total", **e) == total(
        after, "turnout_engine_generation_tokens_total", engine=engine
    )
    assert (
        total(after, "vllm:request_success_total", finished_reason="length", **e)
        == total(before, "vllm:request_success_total", finished_reason="length", **e) + 1
    )
    assert total(after, "vllm:prompt_tokens_total", **e) > total(before, "vllm:prompt_tokens_total", **e)
    assert total(after, "vllm:time_to_first_token_seconds_count", **e) > 0
    assert labelled(after, "vllm:num_requests_running", "engine") == {engine}
    assert labelled(after, "vllm:kv_cache_usage_perc", "model_name") == {model}

    # The router's and the tokenizer's series, through the router's Metrics.Scrape.
    routed = "turnout_router_engine_requests_total"
    assert total(after, routed, engine=engine) == total(before, routed, engine=engine) + 1
    tokenizer = f"127.0.0.1:{tiny_stack.tokenizer_port}"
    encoded = "turnout_tokenizer_requests_total"
    assert total(after, encoded, tokenizer=tokenizer, method="Encode", code="OK") > total(
        before, encoded, tokenizer=tokenizer, method="Encode", code="OK"
    )
    # Every service's process shows its garbage collector's pauses, each under its own name.
    assert labelled(after, "turnout_gc_pause_seconds_count", "service") == {"engine", "tokenizer", "router", "gateway"}
    assert labelled(after, "turnout_gc_pause_seconds_count", "engine") == {engine}
    # Every service answered.
    up = "turnout_scrape_up"
    assert total(after, up, service="router", address=f"127.0.0.1:{tiny_stack.router_port}") == 1
    assert total(after, up, service="engine", address=engine) == 1
    assert total(after, up, service="tokenizer", address=tokenizer) == 1


def test_dashboard_queries_only_series_on_the_page(tiny_stack: Stack) -> None:
    # A request first, so that families labelled by what happened (routing reasons) have samples.
    assert httpx.post(f"{tiny_stack.base_url}/v1/completions", json=BODY, timeout=120).status_code == 200
    offered = exposed_names(page(tiny_stack))
    missing = {(name, expr) for expr in queries(load_dashboard()) for name in metric_names(expr) if name not in offered}
    assert not missing
