"""Every service's startup heap, kept out of Python's cyclic garbage collector, and how often it collects.

A service builds a large heap once (torch and the model in the engine, transformers in the
tokenizer, grpc and protobuf in each, FastAPI and pydantic in the gateway) and then, per token,
allocates small objects that mostly die young. The collector's passes over the older
generations walk every tracked object, the startup heap included, so with that heap they were
the cost: on the engine's step thread (256 sequences decoding, `--skip-forward`) 17 µs of CPU per
token with them, 10.7 once the startup heap is frozen (docs/benchmarks.md, "The startup heap out of
the collector"). `gc.freeze()` moves every object alive now to a permanent generation that no
collection walks; collections still run, over what is allocated after. vLLM freezes its engine's
heap once the model is warmed up; SGLang offers the same as an endpoint.

Freezing for good is for service processes, once they are built: an object frozen that later
becomes cyclic garbage is never collected (reference counting still frees the rest), which a long
test process building and dropping many services would accumulate. A benchmark that builds and
drops several engines in one process measures each the way the service runs it with
`frozen_heap()`, which unfreezes when the measurement ends.

Once frozen, a service collects its young objects every `YOUNG_COLLECTION_THRESHOLD` allocations (less
deallocations) of tracked objects, not CPython's 700. Under load a service allocates its objects in bursts
that live a little while (a step's outputs for 256 requests, their protobuf messages, the coroutines they
wake): at 700 a collection comes several times a step, finds most of the burst still alive and promotes
it, so the older generations fill with objects that die soon after and are walked again there; and with
the startup heap frozen, the permanent generation no longer counts as "long-lived" in CPython's rule for a
full collection (one runs once the objects promoted since the last are a quarter of those that stayed), so
full collections came about once a second. At 256 streams through the gateway the collector took 11-13%
of the engine's, router's and gateway's CPU and 6% of the tokenizer's, with full collections of up to
134 ms (engine) and 64 ms (gateway) (docs/benchmarks.md, "The garbage collector under load";
`turnout_gc_pause_seconds` shows it live, turnout/telemetry/gc_metrics.py).

Why young collections still came about once a second at 20,000 while the live set stayed level: a
collection resets the count to 0, and a deallocation lowers it only while it is above 0 (CPython 3.11), so
the count is a random walk that drops every step below zero, and bursts of allocations and frees push it
up. The higher the threshold, the rarer it is reached, by far more than the ratio of thresholds: at 256
streams through the gateway, every ~0.8 s at 20,000, every ~9 s at 50,000, once in 165 s at 100,000. And a
young collection of the router or gateway under that load is not cheap: 19,000-33,000 young objects hold
110,000-170,000 references into a heap that is not in the cache, 7-26 ms of CPU a collection. Router and
gateway over a minute of that load (docs/benchmarks.md, "Fewer young collections"): 20,000 cost 2.5 s of
CPU, the longest collection 42-50 ms; 50,000 cost 0.45 s, the longest 44-46 ms; 100,000's one collection
took 125 ms (everything allocated since the last one and still alive, walked at once). So 50,000: a fifth
of the CPU for the same longest pause. TensorRT-LLM (20,000) and lmdeploy raise the threshold for the same
reason. Reference cycles are still collected, only found later; the gateway's request paths make none
(tests/gateway/test_reference_cycles.py), the router about one object a second under that load.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import time
from collections.abc import Iterator

log = logging.getLogger(__name__)
_unfreeze_registered = False

# Young collections come after this many allocations less deallocations of tracked objects (CPython: 700);
# the older generations keep CPython's thresholds (10 and 10 of the next younger's collections). Against
# 20,000: a fifth of the collector's CPU in the router and gateway, the same longest pause (above).
YOUNG_COLLECTION_THRESHOLD = 50_000


def _collect_young_every(threshold: int) -> None:
    gc.set_threshold(threshold, *gc.get_threshold()[1:])


def freeze_startup_heap() -> None:
    """Collect what is garbage now, freeze everything alive, and from now on collect young objects every
    YOUNG_COLLECTION_THRESHOLD allocations."""
    global _unfreeze_registered
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    _collect_young_every(YOUNG_COLLECTION_THRESHOLD)
    log.info(
        "startup heap frozen",
        extra={
            "objects": gc.get_freeze_count(),
            "seconds": round(time.perf_counter() - started, 3),
            "young_collection_threshold": YOUNG_COLLECTION_THRESHOLD,
        },
    )
    if not _unfreeze_registered:
        # At exit the interpreter's last collections see everything again, as if nothing was
        # frozen: extension modules that count what outlives them (nanobind, in Triton) stay quiet.
        atexit.register(gc.unfreeze)
        _unfreeze_registered = True


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Everything alive on entry frozen, and young objects collected as a service collects them, until
    exit; then back in the collector's reach (what became garbage meanwhile is collected at the next
    collection) with the threshold of before: a measurement in the service's conditions."""
    before = gc.get_threshold()[0]
    gc.collect()
    gc.freeze()
    _collect_young_every(YOUNG_COLLECTION_THRESHOLD)
    try:
        yield
    finally:
        _collect_young_every(before)
        gc.unfreeze()
