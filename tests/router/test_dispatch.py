"""The router in front of fake engines: load accounting, retries, aborts, health, breaker, admission."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from grpc import aio

from tests.router.conftest import Cluster, eventually, finish_of, text_of
from turnout.v1 import common_pb2, inference_pb2, router_admin_pb2

FULL_TEXT = "<100><101><102>"
Make = Callable[..., Any]


def hold_all(cluster: Cluster) -> asyncio.Event:
    release = asyncio.Event()
    for engine in cluster.engines:
        engine.hold = release
    return release


async def open_streams(cluster: Cluster, count: int) -> list[asyncio.Task[Any]]:
    """Start `count` streams with unrelated prompts, each seen by an engine before the next starts."""
    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(cluster.generate(chr(ord("a") + i) * 12)))
        await eventually(lambda i=i: sum(cluster.by_engine()) == i + 1)
    return tasks


async def test_round_robin_spreads_evenly(make_cluster: Make) -> None:
    cluster = await make_cluster(3, policy="round_robin")
    for i in range(9):
        assert text_of(await cluster.generate(f"p{i}")) == FULL_TEXT
    assert cluster.by_engine() == [3, 3, 3]


@pytest.mark.parametrize("policy", ["least_load", "power_of_two", "cache_aware"])
async def test_open_streams_count_as_load(make_cluster: Make, policy: str) -> None:
    """The test that catches a router that never counts load: with the engines' own
    reports switched off, only the router's in-flight count can spread concurrent
    streams; without it every tie goes to the first engine."""
    cluster = await make_cluster(3, policy=policy, load_poll_interval_s=0.0)
    release = hold_all(cluster)
    tasks = await open_streams(cluster, 12)
    counts = cluster.by_engine()
    if policy == "power_of_two":
        assert min(counts) >= 2, counts  # random pairs: close to even, never one engine
    else:
        assert counts == [4, 4, 4]
    statuses = await cluster.statuses()
    assert sorted(s.in_flight for s in statuses.values()) == sorted(counts)
    release.set()
    await asyncio.gather(*tasks)
    assert [s.in_flight for s in (await cluster.statuses()).values()] == [0, 0, 0]


async def test_least_load_follows_a_slow_engine(make_cluster: Make) -> None:
    cluster = await make_cluster(3, policy="least_load")
    cluster.engines[0].token_delay_s = 0.05  # every stream there lasts 10x longer
    for engine in cluster.engines[1:]:
        engine.token_delay_s = 0.005

    async def client(k: int) -> None:
        for i in range(6):
            await cluster.generate(f"client {k} request {i}")

    await asyncio.gather(*(client(k) for k in range(6)))
    slow, *fast = cluster.by_engine()
    assert slow < min(fast), cluster.by_engine()


async def test_cache_aware_keeps_a_prefix_on_one_engine_and_spreads_the_rest(make_cluster: Make) -> None:
    cluster = await make_cluster(3, policy="cache_aware")
    prefix = "You are a helpful assistant. " * 4
    for i in range(5):
        await cluster.generate(f"{prefix}question {i}")
    assert sorted(cluster.by_engine()) == [0, 0, 5]
    for i in range(6):
        await cluster.generate(f"unrelated prompt number {i} " * (i + 1))
    assert all(count >= 2 for count in cluster.by_engine()), cluster.by_engine()
    statuses = await cluster.statuses()
    assert all(s.prefix_tree_tokens > 0 for s in statuses.values())
    assert cluster.runtime.engines.decisions["cache_hit"] >= 4


async def test_failure_before_output_is_retried_elsewhere_without_duplicating(make_cluster: Make) -> None:
    cluster = await make_cluster(3, policy="round_robin", circuit_breaker_failures=0)
    cluster.engines[0].fail = grpc.StatusCode.UNAVAILABLE
    for i in range(6):
        responses = await cluster.generate(f"p{i}")
        assert text_of(responses) == FULL_TEXT
        assert [f.WhichOneof("kind") for f in finish_of(responses)] == ["length"]
    failed = len(cluster.engines[0].received)
    assert failed >= 2  # round-robin kept sending it its turns
    assert sum(cluster.by_engine()) == 6 + failed  # each failure was retried once, elsewhere
    status = (await cluster.statuses())[cluster.engines[0].address]
    assert status.retried_total == status.failures_total == failed


async def test_failure_after_output_ends_every_sample_with_an_abort(make_cluster: Make) -> None:
    cluster = await make_cluster(2, policy="round_robin")
    for engine in cluster.engines:
        engine.fail_after = 2
    responses = await cluster.generate("p", n=2)
    assert text_of(responses) == "<100><100><101><101>"  # two samples, two tokens each, nothing repeated
    finishes = finish_of(responses)
    assert [f.WhichOneof("kind") for f in finishes] == ["abort", "abort"]
    message = finishes[0].abort.message
    assert cluster.engines[0].address in message and "INTERNAL" in message and "incomplete" in message
    assert sum(cluster.by_engine()) == 1  # not retried: output had been sent


@pytest.mark.parametrize(("n", "steps_per_message"), [(1, 1), (1, 2), (2, 1), (2, 2)])
async def test_an_abort_after_output_counts_the_tokens_each_sample_had(
    make_cluster: Make, n: int, steps_per_message: int
) -> None:
    cluster = await make_cluster(1)
    engine = cluster.engines[0]
    engine.tokens, engine.fail_after, engine.steps_per_message = 6, 3, steps_per_message
    responses = await cluster.generate("pq", n=n)
    completes = [r.complete for r in responses if r.WhichOneof("kind") == "complete"]
    assert [c.finish_reason.WhichOneof("kind") for c in completes] == ["abort"] * n
    sent = 3 // steps_per_message * steps_per_message  # the engine breaks before the message with token 3
    assert [(c.usage.prompt_tokens, c.usage.completion_tokens) for c in completes] == [(2, sent)] * n


async def test_the_engines_own_refusal_is_not_retried(make_cluster: Make) -> None:
    cluster = await make_cluster(3)
    for engine in cluster.engines:
        engine.fail = grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(aio.AioRpcError) as caught:
        await cluster.generate("p")
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert sum(cluster.by_engine()) == 1


@pytest.mark.parametrize(
    ("engine_code", "router_code"),
    [
        (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAVAILABLE),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.RESOURCE_EXHAUSTED),
    ],
)
async def test_bounded_retries_then_a_clear_error(
    make_cluster: Make, engine_code: grpc.StatusCode, router_code: grpc.StatusCode
) -> None:
    cluster = await make_cluster(2, max_retries=2, circuit_breaker_failures=0)
    for engine in cluster.engines:
        engine.fail = engine_code
    with pytest.raises(aio.AioRpcError) as caught:
        await cluster.generate("p")
    assert caught.value.code() is router_code
    assert "every attempt failed" in (caught.value.details() or "")
    assert sum(cluster.by_engine()) == 3  # one try and two retries, both engines used


async def test_no_healthy_engine_is_unavailable_at_once(make_cluster: Make) -> None:
    cluster = await make_cluster(2)
    for engine in cluster.engines:
        await engine.stop()
    await cluster.wait_routable(0)
    started = time.monotonic()
    with pytest.raises(aio.AioRpcError) as caught:
        await cluster.generate("p")
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "no healthy engine" in (caught.value.details() or "")
    assert time.monotonic() - started < 1.0


async def test_circuit_breaker_stops_traffic_to_an_engine_that_keeps_failing(make_cluster: Make) -> None:
    cluster = await make_cluster(2, policy="round_robin", circuit_breaker_failures=2)
    bad = cluster.engines[0]
    bad.fail = grpc.StatusCode.INTERNAL  # passes health checks, fails every request
    for i in range(8):
        assert text_of(await cluster.generate(f"p{i}")) == FULL_TEXT
    assert len(bad.received) == 2
    status = (await cluster.statuses())[bad.address]
    assert status.circuit == router_admin_pb2.EngineStatus.CIRCUIT_OPEN and not status.routable
    assert status.health == router_admin_pb2.EngineStatus.HEALTH_HEALTHY


async def test_unhealthy_engine_is_skipped_and_comes_back(make_cluster: Make) -> None:
    cluster = await make_cluster(3, policy="round_robin")
    sick = cluster.engines[1]
    await sick.set_serving(False)
    await cluster.wait_routable(2)
    assert (await cluster.statuses())[sick.address].health == router_admin_pb2.EngineStatus.HEALTH_UNHEALTHY
    for i in range(4):
        await cluster.generate(f"p{i}")
    assert len(sick.received) == 0
    await sick.set_serving(True)
    await cluster.wait_routable(3)
    for i in range(3):
        await cluster.generate(f"q{i}")
    assert len(sick.received) == 1


async def test_stopped_engine_restarted_on_its_port_gets_traffic_again(make_cluster: Make) -> None:
    cluster = await make_cluster(2, policy="round_robin")
    dead = cluster.engines[0]
    await dead.stop()
    await cluster.wait_routable(1)
    await dead.start()  # same port
    await cluster.wait_routable(2)
    for i in range(4):
        await cluster.generate(f"p{i}")
    assert len(dead.received) == 2


async def test_engine_killed_mid_stream_aborts_its_streams_and_new_ones_go_elsewhere(make_cluster: Make) -> None:
    cluster = await make_cluster(2, policy="round_robin")
    release = hold_all(cluster)
    tasks = await open_streams(cluster, 4)
    victim = cluster.engines[0]
    await victim.stop()
    results = await asyncio.gather(*tasks[::2])  # the ones on the victim
    for responses in results:
        assert text_of(responses) == FULL_TEXT  # all the output it had, once
        (finish,) = finish_of(responses)
        assert finish.WhichOneof("kind") == "abort" and victim.address in finish.abort.message
    release.set()
    assert all(text_of(r) == FULL_TEXT for r in await asyncio.gather(*tasks[1::2]))
    for i in range(3):  # whether or not health has noticed yet: retried on the live engine
        assert text_of(await cluster.generate(f"after {i}")) == FULL_TEXT


async def test_cancelled_call_frees_the_engine_and_the_router(make_cluster: Make) -> None:
    cluster = await make_cluster(1)
    engine = cluster.engines[0]
    engine.hold = asyncio.Event()
    call = cluster.inference.Generate(inference_pb2.GenerateRequest(text="p"))
    assert (await call.read()).chunk.text == "<100>"
    assert engine.active == 1
    call.cancel()
    await eventually(lambda: engine.active == 0)
    assert engine.cancelled == 1
    pool = cluster.runtime.engines
    await eventually(lambda: pool.engines[0].in_flight == 0 and pool.admission.active == 0)


async def test_full_router_answers_resource_exhausted(make_cluster: Make) -> None:
    cluster = await make_cluster(1, max_concurrent_requests=2, max_queued_requests=1, queue_timeout_s=5)
    release = hold_all(cluster)
    running = await open_streams(cluster, 2)
    queued = asyncio.create_task(cluster.generate("queued"))
    await eventually(lambda: cluster.runtime.engines.admission.queued == 1)
    with pytest.raises(aio.AioRpcError) as caught:
        await cluster.generate("one too many")
    assert caught.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max-concurrent-requests" in (caught.value.details() or "")
    release.set()
    for responses in await asyncio.gather(*running, queued):
        assert text_of(responses) == FULL_TEXT


async def test_load_accounting_returns_to_zero_after_a_burst_with_errors_and_cancellations(make_cluster: Make) -> None:
    cluster = await make_cluster(3, policy="least_load", circuit_breaker_failures=0, max_concurrent_requests=8)
    cluster.engines[0].fail = grpc.StatusCode.UNAVAILABLE  # fails before output: retried
    cluster.engines[1].fail_after = 1  # fails after output: aborted
    for engine in cluster.engines:
        engine.token_delay_s = 0.01

    async def one(i: int) -> None:
        call = cluster.inference.Generate(inference_pb2.GenerateRequest(text=f"burst {i}"))
        if i % 3 == 0:
            await asyncio.sleep(0.015)
            call.cancel()  # while queued, waiting, or streaming
            return
        async for _ in call:
            pass

    results = await asyncio.gather(*(one(i) for i in range(30)), return_exceptions=True)
    assert not [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
    pool = cluster.runtime.engines
    await eventually(lambda: all(e.in_flight == 0 for e in pool.engines) and pool.admission.active == 0)
    await eventually(lambda: all(e.active == 0 for e in cluster.engines))
    assert pool.admission.queued == 0
    assert sum(e.requests_total for e in pool.engines) >= 20


async def test_tokens_reach_the_caller_exactly_once_per_sample(make_cluster: Make) -> None:
    cluster = await make_cluster(1)
    cluster.engines[0].tokens = 20
    responses = await cluster.generate("p", n=2)
    await asyncio.sleep(0.05)
    assert cluster.tokenizer.streams == 2  # one Detokenize stream per sample, not one per chunk
    chunks = [r.chunk for r in responses if r.WhichOneof("kind") == "chunk"]
    by_sample: dict[int, list[int]] = {}
    for chunk in chunks:
        by_sample.setdefault(chunk.index, []).extend(chunk.token_ids)
    assert by_sample == {0: list(range(100, 120)), 1: list(range(100, 120))}
    assert [f.length.length for f in finish_of(responses)] == [20, 20]
    assert isinstance(finish_of(responses)[0], common_pb2.FinishReason)
