"""Every service's startup heap, kept out of Python's cyclic garbage collector.

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


def freeze_startup_heap() -> None:
    """Collect what is garbage now, then freeze everything alive."""
    global _unfreeze_registered
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.info(
        "startup heap frozen",
        extra={"objects": gc.get_freeze_count(), "seconds": round(time.perf_counter() - started, 3)},
    )
    if not _unfreeze_registered:
        # At exit the interpreter's last collections see everything again, as if nothing was
        # frozen: extension modules that count what outlives them (nanobind, in Triton) stay quiet.
        atexit.register(gc.unfreeze)
        _unfreeze_registered = True


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Everything alive on entry frozen until exit, then back in the collector's reach (what became
    garbage meanwhile is collected at the next collection): a measurement in the service's conditions."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
