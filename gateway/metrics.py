"""The gateway's Prometheus metrics (`GET /metrics` on its HTTP port) and its span per HTTP request.

`Observability` is a plain ASGI middleware: every HTTP request is timed and counted by route
and status, and, while tracing is on, runs inside a SERVER span that the router call carries
on (so the whole request is one trace). Generation reports each chunk through `on_chunk()`,
which finds the request's recorder in a context variable: no object has to be threaded through
the handlers.

| metric | labels | what |
| --- | --- | --- |
| `turnout_gateway_requests_total` | route, method, status | HTTP requests by route template and status code |
| `turnout_gateway_e2e_request_latency_seconds` | route | request received to last body byte sent |
| `turnout_gateway_time_to_first_token_seconds` | | request received to the first chunk with tokens |
| `turnout_gateway_inter_token_latency_seconds` | | between two chunks of one sample, as the router sends them |
| `turnout_gateway_prompt_tokens_total`, `..._generation_tokens_total` | | tokens of finished prompts, and received |

TTFT and ITL are recorded for every generate request, streamed or not: the gateway reads a
stream from the router either way.

`/metrics` is the whole stack's page: these series, and what the router's `Metrics.Scrape`
returns (its own, every engine's and every tokenizer's: services/router/stack_metrics.py),
merged. A router that does not answer within `ROUTER_SCRAPE_TIMEOUT_S` costs its part of the
page and shows as `turnout_scrape_up{service="router"} 0`; the gateway's own series are always
there.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from turnout.gateway_replicas import MULTIPROC_DIR_ENV
from turnout.telemetry import exposition, tracing
from turnout.telemetry.gc_metrics import register_gc_pauses
from turnout.telemetry.metrics_http import REQUEST_LATENCY_BUCKETS, TOKEN_LATENCY_BUCKETS
from turnout.telemetry.metrics_service import scrape
from turnout.telemetry.request_context import set_request_id
from turnout.v1 import inference_pb2

PREFIX = "turnout_gateway"
# Seconds the router may take for the stack's page; it gives each engine and tokenizer at most
# BACKEND_SCRAPE_TIMEOUT_S of that, so a hung engine still leaves the router time to answer.
# Both stay well under Prometheus' default scrape timeout (10 s).
ROUTER_SCRAPE_TIMEOUT_S = 4.0
BACKEND_SCRAPE_TIMEOUT_S = 2.0


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests", "HTTP requests by route and status", ["route", "method", "status"], registry=r
        )
        self.e2e = Histogram(
            f"{PREFIX}_e2e_request_latency_seconds",
            "Request received to response sent",
            ["route"],
            registry=r,
            buckets=REQUEST_LATENCY_BUCKETS,
        )
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds", "Request to first token", registry=r, buckets=TOKEN_LATENCY_BUCKETS
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Between chunks of a sample",
            registry=r,
            buckets=TOKEN_LATENCY_BUCKETS,
        )
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of finished prompts", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens received", registry=r)


@dataclass
class _Recorder:
    """One HTTP request's token timings."""

    metrics: GatewayMetrics
    started: float
    first_token: float | None = None
    # Last chunk time of each sample (the request-wide sample index).
    last: dict[int, float] = field(default_factory=dict)


_current: ContextVar[_Recorder | None] = ContextVar("turnout_gateway_request", default=None)


def on_chunk(sample: int, num_tokens: int) -> None:
    """A chunk of `num_tokens` tokens of `sample` arrived from the router."""
    recorder = _current.get()
    if recorder is None or not num_tokens:
        return
    now = time.perf_counter()
    m = recorder.metrics
    if recorder.first_token is None:
        recorder.first_token = now
        m.ttft.observe(now - recorder.started)
    last = recorder.last.get(sample)
    if last is not None:
        m.itl.observe(now - last)
    recorder.last[sample] = now
    m.generation_tokens.inc(num_tokens)


def on_prompt_done(prompt_tokens: int) -> None:
    recorder = _current.get()
    if recorder is not None:
        recorder.metrics.prompt_tokens.inc(prompt_tokens)


def on_generate(requests: Sequence[inference_pb2.GenerateRequest]) -> None:
    """The router calls of this HTTP request are about to start: tag logs and the span with what they are."""
    if not requests:
        return
    set_request_id(requests[0].request_id)
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute("turnout.request_id", requests[0].request_id)
        span.set_attribute("turnout.model", requests[0].model)
        span.set_attribute("turnout.prompts", len(requests))


class Observability:
    """ASGI middleware: metrics for every HTTP request, and its span while tracing is on."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics
        self.tracer = tracing.tracer("gateway")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        recorder = _Recorder(self.metrics, time.perf_counter())
        token = _current.set(recorder)
        status = [500]  # what the client gets if the app fails before starting a response

        async def send_recording(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        headers = dict(scope.get("headers") or ())
        set_request_id((headers.get(b"x-request-id") or b"").decode("latin-1") or None)
        try:
            if self.tracer is None:
                await self.app(scope, receive, send_recording)
            else:
                await self._traced(scope, receive, send_recording, status)
        finally:
            _current.reset(token)
            route = _route(scope)
            self.metrics.requests.labels(route, scope["method"], str(status[0])).inc()
            self.metrics.e2e.labels(route).observe(time.perf_counter() - recorder.started)

    async def _traced(self, scope: Scope, receive: Receive, send: Send, status: list[int]) -> None:
        assert self.tracer is not None
        method = scope["method"]
        with self.tracer.start_as_current_span(
            f"{method} {scope['path']}",
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope["path"], "turnout.service": "gateway"},
        ) as span:
            try:
                await self.app(scope, receive, send)
            finally:
                route = _route(scope)
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status[0])
                if status[0] >= 500:
                    span.set_status(Status(StatusCode.ERROR, f"HTTP {status[0]}"))


def _route(scope: Scope) -> str:
    """The matched route's template (bounded label values); `unmatched` for 404s of unknown paths."""
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else "unmatched"


router = APIRouter()


@router.get("/metrics")
async def metrics_endpoint(request: Request) -> Response:
    own = _own_page(request.app.state.metrics)
    client = request.app.state.router
    if client.channel is None:  # an app built around bare stubs (tests): no stack to ask
        return Response(own, media_type=CONTENT_TYPE_LATEST)
    stack = await scrape(client.channel, ROUTER_SCRAPE_TIMEOUT_S, BACKEND_SCRAPE_TIMEOUT_S)
    page = await asyncio.to_thread(_stack_page, own, stack, client.address)
    return Response(page, media_type=CONTENT_TYPE_LATEST)


def _own_page(metrics: GatewayMetrics) -> str:
    """This gateway's series; with several gateway processes (`turnout serve --api-server-count`, which
    gives them one PROMETHEUS_MULTIPROC_DIR), every one's, summed: a scrape reaches any of them."""
    if not os.environ.get(MULTIPROC_DIR_ENV):
        return generate_latest(metrics.registry).decode()
    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    register_gc_pauses(registry, "gateway")  # the process answering: the collector's pauses are per process
    return generate_latest(registry).decode()


def _stack_page(own: str, stack: str | None, router_address: str) -> bytes:
    parts = [exposition.parse(own)]
    if stack is not None:
        try:
            parts.append(exposition.parse(stack))
        except ValueError:  # a malformed page counts as no answer
            stack = None
    parts.append([exposition.scrape_up("router", {router_address: stack is not None})])
    return exposition.render(exposition.merge(parts))
