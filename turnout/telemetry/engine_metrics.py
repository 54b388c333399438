"""The engine's request timeline and Prometheus metrics.

The step-loop thread writes a request's `RequestTimeline` (wall-clock nanoseconds, so the
times can become span events) and observes the histograms as a step's outputs leave it
(`on_step`, once per step); the gRPC side only reads the timeline once the request's last output
has arrived (handed over through the event loop, so every write happened before). Gauges are
read at scrape time.

What is observed per output (the inter-token gap) goes to a `SingleWriterHistogram`, which takes no
lock; what is counted per output (generated tokens) is added up and counted once per step.
prometheus_client's own histogram took 3 µs per output (a lock per bucket and per sum), a tenth of
the zero-cost engine's CPU per token, on the thread every step runs on (docs/benchmarks.md).

| metric | labels | what |
| --- | --- | --- |
| `turnout_engine_requests_total` | finish_reason | finished requests: stop, length, abort |
| `turnout_engine_prompt_tokens_total` | | prompt tokens of requests whose prefill completed |
| `turnout_engine_generation_tokens_total` | | tokens sampled (every sample of every request) |
| `turnout_engine_queue_time_seconds` | | arrival to first scheduled |
| `turnout_engine_time_to_first_token_seconds` | | arrival to first token (queue + prefill) |
| `turnout_engine_inter_token_latency_seconds` | | between two outputs of one sample |
| `turnout_engine_e2e_request_latency_seconds` | | arrival to the request's last output |
| `turnout_engine_running_requests`, `turnout_engine_waiting_requests` | | scheduler queues now |
| `turnout_engine_kv_cache_usage_ratio` | | share of KV blocks in use, 0..1 |
| `turnout_engine_prefix_cache_queried_tokens_total`, `..._hit_tokens_total` | | prompt tokens looked up in |
| | | the prefix cache, and found there: hit rate = rate(hit) / rate(queried) |
| `turnout_engine_preemptions_total` | | running sequences preempted (blocks freed, recomputed later) |

Each of these is also on the page under vLLM's name with a `model_name` label (vllm_names.py).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from turnout.telemetry.metrics_http import REQUEST_LATENCY_BUCKETS, TOKEN_LATENCY_BUCKETS
from turnout.telemetry.vllm_names import vllm_families

NS = 1e-9


@dataclass
class RequestTimeline:
    """When one engine request reached each stage (time.time_ns(); None: not yet)."""

    queued_ns: int = field(default_factory=time.time_ns)
    scheduled_ns: int | None = None
    first_token_ns: int | None = None
    finished_ns: int | None = None
    # Last output time of each sample, for inter-token latency.
    _last_ns: dict[int, int] = field(default_factory=dict)

    @property
    def queue_time_s(self) -> float | None:
        return None if self.scheduled_ns is None else (self.scheduled_ns - self.queued_ns) * NS

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_ns is None else (self.first_token_ns - self.queued_ns) * NS


class _Finish(Protocol):
    @property
    def kind(self) -> str: ...


class StepOutput(Protocol):
    """What the metrics read of one output of a step (services/engine/request.py's EngineOutput)."""

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def index(self) -> int: ...

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def finish(self) -> _Finish | None: ...

    @property
    def request_finished(self) -> bool: ...


class SingleWriterHistogram:
    """A Prometheus histogram that one thread observes (the step loop) and a scrape reads, without a
    lock. The bucket counts are copied in one call under the GIL, so a scrape sees them consistent
    with one another (`_count` is the +Inf bucket); the sum may be one observation apart from them."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name = name
        self._documentation = documentation
        self._upper = tuple(buckets)
        self._counts = [0] * (len(self._upper) + 1)  # per bucket, not cumulative; the last is +Inf
        self._sum = 0.0
        self._created = time.time()

    def observe(self, value: float) -> None:
        self._counts[bisect_left(self._upper, value)] += 1  # the first bound >= value: `le` holds it
        self._sum += value

    def samples(self) -> Iterator[Sample]:
        """The histogram's samples (buckets, count, sum, created), for a family of one or of several."""
        counts, total = list(self._counts), self._sum
        cumulative = 0
        for bound, count in zip((*self._upper, float("inf")), counts, strict=True):
            cumulative += count
            yield Sample(f"{self.name}_bucket", {"le": floatToGoString(bound)}, cumulative)
        yield Sample(f"{self.name}_count", {}, cumulative)
        yield Sample(f"{self.name}_sum", {}, total)
        yield Sample(f"{self.name}_created", {}, self._created)

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self._documentation, "histogram")
        family.samples = list(self.samples())
        yield family


@dataclass(frozen=True)
class EngineGauges:
    running: int
    waiting: int
    kv_cache_usage: float
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    preemptions: int


class EngineMetrics:
    def __init__(self, registry: CollectorRegistry | None = None, *, model_name: str = "") -> None:
        self.registry = registry or CollectorRegistry()
        p = "turnout_engine"
        # Not registered one by one: `_EngineCollector` reads each once per scrape and yields it under
        # both name sets, so `turnout_engine_*` and `vllm:*` show the same values, not two reads apart.
        self.requests = Counter(f"{p}_requests", "Finished requests by finish reason", ["finish_reason"], registry=None)
        self.prompt_tokens = Counter(f"{p}_prompt_tokens", "Prompt tokens prefilled", registry=None)
        self.generation_tokens = Counter(f"{p}_generation_tokens", "Tokens generated", registry=None)
        self.queue_time = Histogram(
            f"{p}_queue_time_seconds", "Arrival to first scheduled", registry=None, buckets=REQUEST_LATENCY_BUCKETS
        )
        self.ttft = Histogram(
            f"{p}_time_to_first_token_seconds", "Arrival to first token", registry=None, buckets=TOKEN_LATENCY_BUCKETS
        )
        self.itl = SingleWriterHistogram(
            f"{p}_inter_token_latency_seconds", "Between outputs of a sample", TOKEN_LATENCY_BUCKETS
        )
        self.e2e = Histogram(
            f"{p}_e2e_request_latency_seconds", "Arrival to last output", registry=None, buckets=REQUEST_LATENCY_BUCKETS
        )
        self._gauges: _GaugeCollector | None = None
        self.registry.register(_EngineCollector(self, model_name))

    def watch(self, gauges: Callable[[], EngineGauges]) -> None:
        """Report the scheduler and KV cache state `gauges()` returns at every scrape."""
        self._gauges = _GaugeCollector(gauges)

    def families(self) -> Iterator[Metric]:
        """Every `turnout_engine_*` family, read now."""
        for metric in (self.requests, self.prompt_tokens, self.generation_tokens):
            yield from metric.collect()
        for histogram in (self.queue_time, self.ttft, self.itl, self.e2e):
            yield from histogram.collect()
        if self._gauges is not None:
            yield from self._gauges.collect()

    # -- called on the step-loop thread ----------------------------------------

    def on_scheduled(self, timeline: RequestTimeline, now_ns: int) -> None:
        if timeline.scheduled_ns is None:
            timeline.scheduled_ns = now_ns
            self.queue_time.observe((now_ns - timeline.queued_ns) * NS)

    def on_step(self, step_started_ns: int, now_ns: int, outputs: Iterable[tuple[RequestTimeline, StepOutput]]) -> None:
        """A step that started at `step_started_ns` gave `outputs` (each with its request's timeline) at
        `now_ns`."""
        itl, generated = self.itl, 0
        for timeline, output in outputs:
            num_tokens = len(output.token_ids)
            if num_tokens:
                if timeline.first_token_ns is None:
                    self.on_scheduled(timeline, step_started_ns)  # admitted and finished within this one step
                    timeline.first_token_ns = now_ns
                    self.ttft.observe((now_ns - timeline.queued_ns) * NS)
                    self.prompt_tokens.inc(output.prompt_tokens)
                last = timeline._last_ns.get(output.index)
                if last is not None:
                    itl.observe((now_ns - last) * NS)
                timeline._last_ns[output.index] = now_ns
                generated += num_tokens
            if output.request_finished:
                timeline.finished_ns = now_ns
                self.requests.labels(output.finish.kind if output.finish is not None else "abort").inc()
                self.e2e.observe((now_ns - timeline.queued_ns) * NS)
        if generated:
            self.generation_tokens.inc(generated)


class _EngineCollector(Collector):
    def __init__(self, metrics: EngineMetrics, model_name: str) -> None:
        self._metrics = metrics
        self._model_name = model_name

    def collect(self) -> Iterator[Metric]:
        families = list(self._metrics.families())
        yield from families
        yield from vllm_families(families, self._model_name)


class _GaugeCollector(Collector):
    def __init__(self, gauges: Callable[[], EngineGauges]) -> None:
        self._gauges = gauges

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        g = self._gauges()
        p = "turnout_engine"
        yield GaugeMetricFamily(f"{p}_running_requests", "Requests in the running batch", g.running)
        yield GaugeMetricFamily(f"{p}_waiting_requests", "Requests waiting to be scheduled", g.waiting)
        yield GaugeMetricFamily(f"{p}_kv_cache_usage_ratio", "Share of KV blocks in use", g.kv_cache_usage)
        yield CounterMetricFamily(
            f"{p}_prefix_cache_queried_tokens", "Prompt tokens looked up in the prefix cache", g.prefix_queried_tokens
        )
        yield CounterMetricFamily(
            f"{p}_prefix_cache_hit_tokens", "Prompt tokens found in the prefix cache", g.prefix_hit_tokens
        )
        yield CounterMetricFamily(f"{p}_preemptions", "Running sequences preempted", g.preemptions)
