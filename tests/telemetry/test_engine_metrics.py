"""The engine's step-thread metrics: one call per step, and a lock-free histogram whose page is the one
prometheus_client's own histogram would show."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Literal

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from services.engine.request import EngineOutput, Finish
from turnout.telemetry.engine_metrics import EngineMetrics, RequestTimeline, SingleWriterHistogram
from turnout.telemetry.metrics_http import TOKEN_LATENCY_BUCKETS

# Below the first bound, on bounds (`le` includes them), between, and past the last.
VALUES = (0.0, 0.0005, 0.001, 0.0010001, 0.02, 0.03, 0.06, 0.9, 5.0, 5.5, 1e9)


def _page(collector: Collector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return re.sub(r"_created \S+", "_created T", generate_latest(registry).decode())


class _Collect(Collector):
    def __init__(self, histogram: SingleWriterHistogram) -> None:
        self._histogram = histogram

    def collect(self) -> Iterator[Metric]:
        return self._histogram.collect()


def test_single_writer_histogram_shows_the_page_prometheus_clients_would() -> None:
    ours = SingleWriterHistogram("x_seconds", "Some gaps", TOKEN_LATENCY_BUCKETS)
    theirs = Histogram("x_seconds", "Some gaps", registry=None, buckets=TOKEN_LATENCY_BUCKETS)
    for value in VALUES:
        ours.observe(value)
        theirs.observe(value)
    page = _page(_Collect(ours))
    assert page == _page(theirs)
    assert 'x_seconds_bucket{le="0.001"} 3.0' in page  # 0, 0.0005 and the bound itself
    assert f"x_seconds_count {float(len(VALUES))}" in page


def _output(
    tokens: int, *, index: int = 0, finish: Literal["stop", "length", "abort"] | None = None, last: bool = False
) -> EngineOutput:
    output = EngineOutput(list(range(tokens)), prompt_tokens=5, completion_tokens=tokens, index=index)
    output.finish = Finish(finish) if finish else None
    output.request_finished = last
    return output


def _sample(metrics: EngineMetrics, name: str, **labels: str) -> float:
    for family in metrics.families():
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    raise AssertionError(f"{name} {labels} is not on the page")


def test_a_step_counts_its_tokens_gaps_firsts_and_ends() -> None:
    metrics = EngineMetrics()
    a, b = RequestTimeline(queued_ns=0), RequestTimeline(queued_ns=0)
    metrics.on_scheduled(a, 1_000_000)
    # Step 1: a's first token; b admitted, prefilled, and its two samples' first tokens in one step.
    metrics.on_step(2_000_000, 10_000_000, [(a, _output(1)), (b, _output(1)), (b, _output(1, index=1))])
    assert b.scheduled_ns == 2_000_000  # never seen running: scheduled when its step started
    assert a.scheduled_ns == 1_000_000
    assert a.first_token_ns == b.first_token_ns == 10_000_000
    # Step 2: a ends with two tokens (a speculative step), b's sample 1 is aborted without a token.
    metrics.on_step(
        10_000_000,
        30_000_000,
        [(a, _output(2, finish="stop", last=True)), (b, _output(1)), (b, _output(0, index=1, finish="abort"))],
    )
    assert a.finished_ns == 30_000_000 and b.finished_ns is None
    assert _sample(metrics, "turnout_engine_generation_tokens_total") == 6
    assert _sample(metrics, "turnout_engine_prompt_tokens_total") == 10  # once per request, at its first token
    assert _sample(metrics, "turnout_engine_time_to_first_token_seconds_count") == 2
    assert _sample(metrics, "turnout_engine_inter_token_latency_seconds_count") == 2  # a's and b's sample 0
    assert _sample(metrics, "turnout_engine_inter_token_latency_seconds_sum") == pytest.approx(0.04)
    assert _sample(metrics, "turnout_engine_requests_total", finish_reason="stop") == 1
    assert _sample(metrics, "turnout_engine_e2e_request_latency_seconds_count") == 1
    assert _sample(metrics, "turnout_engine_queue_time_seconds_sum") == pytest.approx(0.003)
