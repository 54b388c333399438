"""The router's `turnout.v1.Metrics`: its own page and that of every engine and tokenizer it knows.

The router is where the stack is known: engines come and go through discovery (static
addresses, DNS names re-resolved, AddEngine), and the channels to them already carry the
credentials and TLS every call needs. So one Scrape here asks each of them concurrently over
those channels, each bounded by a deadline: a dead or hung service costs its own series and
shows as `turnout_scrape_up{service, address} 0`, never the reply. Engine series get an
`engine="<address>"` label, tokenizer series `tokenizer="<address>"`.

A tokenizer address that is a DNS name behind several replicas answers for whichever replica
its channel is connected to.
"""

from __future__ import annotations

import asyncio

from grpc import aio
from prometheus_client import CollectorRegistry, generate_latest

from services.router.engine_pool import EnginePool
from services.router.tokenizer_pool import TokenizerPool
from turnout.telemetry import exposition
from turnout.telemetry.metrics_service import scrape
from turnout.v1 import metrics_pb2, metrics_pb2_grpc

# Seconds an engine or tokenizer may take to answer, unless the caller asks for less: under the
# gateway's own deadline on the router (gateway/metrics.py) and Prometheus' default 10 s timeout.
BACKEND_TIMEOUT_S = 2.0


class StackMetrics(metrics_pb2_grpc.MetricsServicer):
    def __init__(self, registry: CollectorRegistry, engines: EnginePool, tokenizers: TokenizerPool) -> None:
        self._registry = registry
        self._engines = engines
        self._tokenizers = tokenizers

    async def Scrape(
        self, request: metrics_pb2.ScrapeRequest, context: aio.ServicerContext
    ) -> metrics_pb2.ScrapeResponse:
        timeout_s = min(request.backend_timeout_s or BACKEND_TIMEOUT_S, BACKEND_TIMEOUT_S)
        engines = [(e.address, e.channel) for e in list(self._engines.engines)]
        tokenizers = self._tokenizers.channels()
        texts = await asyncio.gather(*(scrape(channel, timeout_s) for _, channel in [*engines, *tokenizers]))
        own = await asyncio.to_thread(generate_latest, self._registry)
        return metrics_pb2.ScrapeResponse(text=await asyncio.to_thread(_page, own.decode(), engines, tokenizers, texts))


def _page(
    own: str,
    engines: list[tuple[str, aio.Channel]],
    tokenizers: list[tuple[str, aio.Channel]],
    texts: list[str | None],
) -> str:
    parts = [exposition.parse(own)]
    up: dict[str, dict[str, bool]] = {"engine": {}, "tokenizer": {}}
    origins = [("engine", address) for address, _ in engines] + [("tokenizer", address) for address, _ in tokenizers]
    for (service, address), text in zip(origins, texts, strict=True):
        families = None
        if text is not None:
            try:
                families = exposition.parse(text, {service: address})
            except ValueError:  # a malformed page: that service is as good as not answering
                families = None
        up[service][address] = families is not None
        if families is not None:
            parts.append(families)
    parts.append([exposition.scrape_up(service, results) for service, results in up.items()])
    return exposition.render(exposition.merge(parts)).decode()
