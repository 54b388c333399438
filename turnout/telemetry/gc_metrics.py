"""How long the garbage collector holds each service's process, per generation.

| metric | labels | what |
| --- | --- | --- |
| `turnout_gc_pause_seconds` | service, generation | each collection's duration (`_count` collections, `_sum` s) |

A collection holds the GIL from start to end, so every thread of the process (the engine's step
loop, every event loop) waits for it: its duration is a pause of the whole service, and
`rate(turnout_gc_pause_seconds_sum[1m])` is the share of the time the service spends in it.
turnout/gc_heap.py says how the services set the collector up and why.

The durations come from `gc.callbacks`, once per process however many registries show them. A
callback runs inside the collection, which can start at any allocation on any thread, even one made
while that thread holds a lock, so it takes none (a prometheus_client Histogram would take its own):
it only adds to per-generation bucket counts, and collections never overlap (the GIL, and the
collector refuses to start while one runs), so there is one writer at a time.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from turnout.telemetry.engine_metrics import SingleWriterHistogram

NAME = "turnout_gc_pause_seconds"
GENERATIONS = (0, 1, 2)
# From a young collection's fraction of a millisecond to a full one of a large heap's seconds.
PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class _Pauses:
    """The process's collections, timed by its one gc callback."""

    def __init__(self) -> None:
        self.by_generation = {
            g: SingleWriterHistogram(NAME, "Garbage collections by generation", PAUSE_BUCKETS) for g in GENERATIONS
        }
        self._started = 0.0
        gc.callbacks.append(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.by_generation[info["generation"]].observe(time.perf_counter() - self._started)


_pauses: _Pauses | None = None


def _process_pauses() -> _Pauses:
    global _pauses
    if _pauses is None:
        _pauses = _Pauses()
    return _pauses


class GcPauses(Collector):
    """This process's collection pauses, labelled with the service it runs."""

    def __init__(self, service: str) -> None:
        self._service = service
        self._pauses = _process_pauses()

    def collect(self) -> Iterator[Metric]:
        family = Metric(NAME, "Garbage collection pauses of the service's process, by generation", "histogram")
        for generation, histogram in self._pauses.by_generation.items():
            labels = {"service": self._service, "generation": str(generation)}
            for sample in histogram.samples():
                family.add_sample(sample.name, {**labels, **sample.labels}, sample.value)
        yield family


def register_gc_pauses(registry: CollectorRegistry, service: str) -> None:
    """Show this process's collection pauses on `registry`'s page, as `service`'s."""
    registry.register(GcPauses(service))
