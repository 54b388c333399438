"""The router's small state machines: circuit breaker, health state, admission, config."""

from __future__ import annotations

import asyncio

import pytest

from services.router.admission import Admission, QueueFull, QueueTimeout
from services.router.circuit_breaker import Circuit, CircuitBreaker
from services.router.config import RouterConfig
from services.router.engine_discovery import resolve_dns, split_target
from services.router.health_checker import Health, HealthState
from services.router.main import build_parser, config_from_args


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_breaker_opens_after_consecutive_failures_and_half_opens_for_one_trial() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=10, clock=clock)
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()  # the run is broken: counting starts again
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is Circuit.CLOSED and breaker.allows()
    breaker.record_failure()
    assert breaker.state is Circuit.OPEN and not breaker.allows()
    clock.now += 10
    assert breaker.state is Circuit.HALF_OPEN and breaker.allows()
    breaker.on_dispatch()
    assert not breaker.allows()  # one trial at a time
    breaker.record_failure()  # the trial failed: open again for a full cool-down
    assert breaker.state is Circuit.OPEN
    clock.now += 10
    breaker.on_dispatch()
    breaker.release_trial()  # cancelled trial: no verdict, the next request may try
    assert breaker.allows()
    breaker.on_dispatch()
    breaker.record_success()
    assert breaker.state is Circuit.CLOSED and breaker.allows()


def test_breaker_threshold_zero_never_opens() -> None:
    breaker = CircuitBreaker(failure_threshold=0, cooldown_s=10)
    for _ in range(100):
        breaker.record_failure()
    assert breaker.allows()


def test_health_state_thresholds() -> None:
    state = HealthState(failure_threshold=2, success_threshold=2)
    assert state.status is Health.STARTING
    assert not state.record(False)  # never seen up: stays starting
    assert state.record(True) and state.status is Health.HEALTHY  # one pass is enough the first time
    assert not state.record(False)
    assert not state.record(True)  # the failure run is broken
    assert not state.record(False)
    assert state.record(False) and state.status is Health.UNHEALTHY
    assert not state.record(True)
    assert state.record(True) and state.status is Health.HEALTHY


async def test_admission_limits_queues_in_order_and_refuses_when_full() -> None:
    admission = Admission(max_concurrent=1, max_queued=2, queue_timeout_s=5)
    order: list[int] = []
    release = asyncio.Event()

    async def use(i: int) -> None:
        async with admission.slot():
            order.append(i)
            await release.wait()

    first = asyncio.create_task(use(0))
    await asyncio.sleep(0)
    queued = [asyncio.create_task(use(i)) for i in (1, 2)]
    await asyncio.sleep(0)
    assert (admission.active, admission.queued) == (1, 2)
    with pytest.raises(QueueFull, match="max-queued-requests"):
        await use(3)
    release.set()
    await asyncio.gather(first, *queued)
    assert order == [0, 1, 2]
    assert (admission.active, admission.queued) == (0, 0)
    assert admission.rejected["queue_full"] == 1


async def test_admission_queue_timeout_and_cancelled_waiters_give_their_place_back() -> None:
    admission = Admission(max_concurrent=1, max_queued=5, queue_timeout_s=0.05)
    hold = asyncio.Event()

    async def holder() -> None:
        async with admission.slot():
            await hold.wait()

    task = asyncio.create_task(holder())
    await asyncio.sleep(0)
    with pytest.raises(QueueTimeout, match="queue-timeout"):
        async with admission.slot():
            pass
    waiter = asyncio.create_task(admission.slot().__aenter__())
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert admission.queued == 0
    hold.set()
    await task
    assert admission.active == 0


def test_config_errors_name_the_flag() -> None:
    base = {"engines": ("127.0.0.1:1",), "tokenizers": ("127.0.0.1:2",)}
    bad = {
        "--policy": {"policy": "fastest"},
        "--cache-threshold": {"cache_threshold": 1.5},
        "--balance-rel-threshold": {"balance_rel_threshold": 0.5},
        "--max-tree-size": {"max_tree_size": 0},
        "--health-check-interval": {"health_check_interval_s": 0},
        "--max-retries": {"max_retries": -1},
        "--max-concurrent-requests": {"max_concurrent_requests": 0},
        "--queue-timeout": {"queue_timeout_s": float("nan")},
        "--engine": {"engines": ("no-port",)},
    }
    for flag, fields in bad.items():
        with pytest.raises(ValueError, match=flag):
            RouterConfig(**{**base, **fields})  # type: ignore[arg-type]
    assert RouterConfig(engines=(), tokenizers=("t:1",)).engines == ()  # engines can come later


def test_cli_flags_reach_the_config() -> None:
    argv = "--engine engine:50051 --tokenizer t:1 --policy power_of_two --max-retries 5"
    argv += " --max-concurrent-requests 7 --dns-refresh-interval 2.5 --metrics-port 9100"
    args = build_parser().parse_args(argv.split())
    config = config_from_args(args)
    assert config.engines == ("engine:50051",) and config.policy == "power_of_two"
    assert (config.max_retries, config.max_concurrent_requests, config.dns_refresh_interval_s) == (5, 7, 2.5)
    assert config.metrics_port == 9100
    assert config.retry_delay_s(1) == config.retry_backoff_s and config.retry_delay_s(30) == 1.0


def test_split_target() -> None:
    assert split_target("10.1.2.3:50051") == ("10.1.2.3", 50051, True)
    assert split_target("[::1]:7") == ("::1", 7, True)
    assert split_target("engine:50051") == ("engine", 50051, False)
    with pytest.raises(ValueError):
        split_target("engine")


async def test_resolve_dns_prefers_ipv4() -> None:
    assert await resolve_dns("localhost", 5) == ["127.0.0.1:5"]
