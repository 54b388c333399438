"""bench_router's one-stream latencies: time to first token and the gaps between tokens as a client sees them."""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics

import pytest

from benchmarks import bench_router
from benchmarks.bench_router import Arrivals, Run
from benchmarks.http_stream import HttpConnection


def test_tokens_read_together_are_zero_apart_and_reads_are_their_time_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.count(start=1.0, step=0.5)  # each read half a second after the last
    monkeypatch.setattr(bench_router.time, "perf_counter", lambda: next(clock))
    arrivals = Arrivals(start=0.25, times=[])
    arrivals.add(1)  # at 1.0
    arrivals.add(3)  # at 1.5: three steps in one message
    arrivals.add(1)  # at 2.0
    assert arrivals.ttft == 0.75
    assert arrivals.gaps == [0.5, 0.0, 0.0, 0.5]
    assert arrivals.tpot == 0.25  # 1 s from the first token to the last, over 4 tokens after the first
    assert statistics.median(arrivals.gaps) == 0.25
    burst = Arrivals(start=0.0, times=[1.0, 2.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0])  # four tokens a read
    assert statistics.median(burst.gaps) == 0.0 and burst.tpot == 0.25  # the pace, where the gaps say 0
    assert math.isnan(Arrivals(start=0.0, times=[1.0]).tpot)
    tpots = [arrivals.tpot, burst.tpot, math.nan]
    run = Run([arrivals.ttft, burst.ttft], len(arrivals.times), 2.0, arrivals.gaps, tpots)
    assert run.median_itl_ms == 250.0 and run.median_ttft_ms == 875.0  # gaps: median of 0, 0, 0.5, 0.5 s
    assert run.median_tpot_ms == 250.0  # a 1-token stream has no pace: left out


async def test_the_bare_http_client_counts_events_whose_start_is_split_between_reads() -> None:
    events = [b'data: {"text":"%d"}\n\n' % i for i in range(5)] + [b"data: [DONE]\n\n"]
    stream = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n" + b"".join(events)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        # Pieces cut inside "data: {" (and between events), each flushed on its own.
        for start in range(0, len(stream), 9):
            writer.write(stream[start : start + 9])
            await writer.drain()
            await asyncio.sleep(0.002)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        port = server.sockets[0].getsockname()[1]
        arrivals = await bench_router.raw_http_stream(HttpConnection(port), [1, 2, 3], 5)
    assert len(arrivals.times) == 5
