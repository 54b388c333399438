"""turnout_gc_pause_seconds: every collection of the process, timed by its generation, on each registry that
shows it under the service's name; one gc callback however many registries there are."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from turnout.telemetry import gc_metrics


def _samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, str], float]:
    text = generate_latest(registry).decode()
    return {
        (sample.labels["service"], sample.labels["generation"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def test_each_collection_is_counted_and_timed_under_its_generation() -> None:
    registry = CollectorRegistry()
    gc_metrics.register_gc_pauses(registry, "engine")
    before = _samples(registry, "turnout_gc_pause_seconds_count")
    before_sum = _samples(registry, "turnout_gc_pause_seconds_sum")
    gc.collect(0)
    gc.collect()  # a full collection: generation 2
    after = _samples(registry, "turnout_gc_pause_seconds_count")
    assert set(after) == {("engine", "0"), ("engine", "1"), ("engine", "2")}
    assert after[("engine", "0")] >= before[("engine", "0")] + 1
    assert after[("engine", "2")] >= before[("engine", "2")] + 1
    assert _samples(registry, "turnout_gc_pause_seconds_sum")[("engine", "2")] > before_sum[("engine", "2")]
    buckets = [
        sample
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
        if sample.name == "turnout_gc_pause_seconds_bucket" and sample.labels["generation"] == "2"
    ]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == after[("engine", "2")]


def test_registries_share_the_process_one_callback() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    gc_metrics.register_gc_pauses(first, "router")
    callbacks = len(gc.callbacks)
    gc_metrics.register_gc_pauses(second, "gateway")
    assert len(gc.callbacks) == callbacks
    gc.collect()
    gc.disable()  # no collection between the two reads
    try:
        ours = _samples(first, "turnout_gc_pause_seconds_count")
        theirs = _samples(second, "turnout_gc_pause_seconds_count")
    finally:
        gc.enable()
    assert {service for service, _ in ours} == {"router"} and {service for service, _ in theirs} == {"gateway"}
    assert {g: n for (_, g), n in ours.items()} == {g: n for (_, g), n in theirs.items()}
