"""The router in front of three real tiny engines, every service a process on loopback.

Engine 0 is the slow one: it runs with `--max-running-requests 1` (one request at a
time while the others batch) and the router reaches it through `SlowLink`, a proxy
that holds each streamed engine step for 300 ms (see slow_link.py for why). Each test starts
its own router process (policies are a router flag); engines and the tokenizer are
shared by the module. The kill test runs last: it SIGKILLs engine 2 and restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from grpc import aio

from gateway.app import create_app
from gateway.config import GatewayConfig
from tests.credentials import ADMIN, TEST_INTERNAL_TOKEN
from tests.e2e.services import Service
from tests.e2e.slow_link import SlowLink
from tests.e2e.stack import start_stack
from turnout.child_processes import free_port
from turnout.grpc_auth import sync_channel
from turnout.grpc_server import client_channel
from turnout.security import ServiceSecurity
from turnout.v1 import (
    common_pb2,
    engine_pb2,
    engine_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    router_admin_pb2,
    router_admin_pb2_grpc,
)

pytestmark = pytest.mark.e2e

ENGINE_FLAGS = ["--device", "cpu", "--num-kv-blocks", "1024"]
HEALTHY = router_admin_pb2.EngineStatus.HEALTH_HEALTHY
UNHEALTHY = router_admin_pb2.EngineStatus.HEALTH_UNHEALTHY


@dataclass
class Backends:
    engines: list[Service]
    tokenizer: Service
    slow: SlowLink
    logs: Path

    @property
    def routes(self) -> list[str]:
        """What the router is given: the slow engine through its proxy, the others directly."""
        return [self.slow.address, *(e.address for e in self.engines[1:])]


@pytest.fixture(scope="module")
def backends(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backends]:
    logs = tmp_path_factory.mktemp("router-e2e")
    model = ["--model", str(tiny_model_dir)]
    slow = ["--max-running-requests", "1"]
    engines = [
        Service(f"engine{i}", ["engine", *model, *ENGINE_FLAGS, *(slow if i == 0 else [])], logs / f"engine{i}.log")
        for i in range(3)
    ]
    tokenizer = Service("tokenizer", ["tokenizer", *model], logs / "tokenizer.log")
    services = [*engines, tokenizer]
    slow = SlowLink(engines[0].address, delay_s=0.3).start()
    try:
        for service in services:
            service.start()
        for service in services:
            service.wait_healthy()
        yield Backends(engines, tokenizer, slow, logs)
    finally:
        stop_all(services)
        slow.stop()


def stop_all(services: list[Service]) -> None:
    for service in services:
        service.terminate()
    for service in services:
        service.stop()


class Router:
    """A router process and async clients of its Inference and RouterAdmin services."""

    def __init__(self, service: Service) -> None:
        self.service = service

    @property
    def address(self) -> str:
        return self.service.address

    async def statuses(self) -> dict[str, router_admin_pb2.EngineStatus]:
        async with client_channel(self.address, ADMIN) as channel:
            reply = await router_admin_pb2_grpc.RouterAdminStub(channel).ListEngines(
                router_admin_pb2.ListEnginesRequest(), timeout=5
            )
        return {s.address: s for s in reply.engines}

    async def admission(self) -> tuple[int, int]:
        async with client_channel(self.address, ADMIN) as channel:
            reply = await router_admin_pb2_grpc.RouterAdminStub(channel).ListEngines(
                router_admin_pb2.ListEnginesRequest(), timeout=5
            )
        return reply.active_requests, reply.queued_requests

    async def requests_by_engine(self, addresses: list[str]) -> list[int]:
        statuses = await self.statuses()
        return [statuses[a].requests_total for a in addresses]

    async def generate(self, input_ids: list[int], max_new_tokens: int = 8) -> list[inference_pb2.GenerateResponse]:
        async with client_channel(self.address, ADMIN) as channel:
            call = inference_pb2_grpc.InferenceStub(channel).Generate(request(input_ids, max_new_tokens), timeout=60)
            return [r async for r in call]


def request(input_ids: list[int], max_new_tokens: int) -> inference_pb2.GenerateRequest:
    params = common_pb2.SamplingParams(max_new_tokens=max_new_tokens, temperature=0, ignore_eos=True)
    return inference_pb2.GenerateRequest(input_ids=common_pb2.TokenIds(ids=input_ids), sampling_params=params)


def prompt(rng: random.Random, length: int = 12) -> list[int]:
    return [rng.randrange(1000, 40000) for _ in range(length)]


async def wait_for(condition: Callable[[], Any], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"not met within {timeout_s}s"
        await asyncio.sleep(0.1)


@pytest.fixture(scope="module")
def start_router(backends: Backends) -> Iterator[Callable[..., Router]]:
    started: list[Service] = []

    def start(*flags: str, engines: list[str] | None = None) -> Router:
        args = ["router", "--tokenizer", backends.tokenizer.address, *flags]
        for address in backends.routes if engines is None else engines:
            args += ["--engine", address]
        service = Service("router", args, backends.logs / f"router{len(started)}.log").start()
        started.append(service)
        service.wait_healthy()  # a deadline for a hung start: a busy machine can take a minute to import grpc
        return Router(service)

    yield start
    stop_all(started)


def all_routable(router: Router, count: int = 3) -> Callable[[], Any]:
    async def check() -> bool:
        return sum(s.routable for s in (await router.statuses()).values()) == count

    return check


def engine_load(engine: Service) -> engine_pb2.Load:
    with sync_channel(engine.address, ADMIN, []) as channel:
        return engine_pb2_grpc.EngineStub(channel).GetLoad(engine_pb2.GetLoadRequest(), timeout=5)


def engines_idle(engines: list[Service]) -> Callable[[], Any]:
    async def check() -> bool:
        return all(engine_load(e).running_requests + engine_load(e).waiting_requests == 0 for e in engines)

    return check


async def test_round_robin_spreads_evenly(start_router: Callable[..., Router], backends: Backends) -> None:
    router = start_router("--policy", "round_robin")
    await wait_for(all_routable(router))
    rng = random.Random(1)
    for _ in range(9):
        await router.generate(prompt(rng), max_new_tokens=4)
    assert await router.requests_by_engine(backends.routes) == [3, 3, 3]


@pytest.mark.parametrize("policy", ["least_load", "power_of_two"])
async def test_load_aware_policies_send_fewer_requests_to_the_slow_engine(
    start_router: Callable[..., Router], backends: Backends, policy: str
) -> None:
    router = start_router("--policy", policy)
    await wait_for(all_routable(router))
    rng = random.Random(2)

    async def client() -> None:
        for _ in range(6):
            await router.generate(prompt(rng), max_new_tokens=8)

    await asyncio.gather(*(client() for _ in range(8)))
    slow, *fast = await router.requests_by_engine(backends.routes)
    assert slow + sum(fast) == 48
    # Fewer than a fast engine's average: power_of_two's ties go to the lower index, so the two
    # fast engines split their share unevenly by design and the smaller one can fall near the slow
    # engine's count on a busy machine. A router that ignored load would send the slow engine
    # (index 0) every tie and fail this; a random one gives it a fast engine's average, and fails
    # about half the runs.
    assert slow < sum(fast) / len(fast), (slow, fast)


async def test_cache_aware_keeps_shared_prefixes_together_and_spreads_the_rest(
    start_router: Callable[..., Router], backends: Backends
) -> None:
    router = start_router("--policy", "cache_aware")
    await wait_for(all_routable(router))
    rng = random.Random(3)
    families = [prompt(rng, 160) for _ in range(3)]  # ten full 16-token blocks each
    engines_of: list[set[int]] = [set() for _ in families]
    cached: list[list[int]] = [[] for _ in families]
    for _ in range(3):
        for f, prefix in enumerate(families):
            before = await router.requests_by_engine(backends.routes)
            responses = await router.generate([*prefix, *prompt(rng, 8)], max_new_tokens=2)
            after = await router.requests_by_engine(backends.routes)
            engines_of[f] |= {i for i in range(3) if after[i] > before[i]}
            cached[f].append(responses[-1].complete.usage.cached_tokens)
    assert all(len(used) == 1 for used in engines_of), engines_of  # each family stayed on one engine
    assert len(set().union(*engines_of)) == 3, engines_of  # and the unrelated families spread out
    for hits in cached:
        assert hits[0] == 0 and all(h >= 144 for h in hits[1:]), cached  # repeats hit the engine's prefix cache


async def test_cancellation_through_the_router_frees_the_engine(
    start_router: Callable[..., Router], backends: Backends
) -> None:
    router = start_router("--policy", "least_load")
    await wait_for(all_routable(router))
    with contextlib.ExitStack() as opened:
        # Connected before the request starts: on a fast engine the request is over in ~2 s (the tiny
        # model's context caps it near 2,000 tokens), and a new channel per look could take that long
        # on a busy machine, so the look would find it finished.
        engines = [
            engine_pb2_grpc.EngineStub(opened.enter_context(sync_channel(e.address, ADMIN, [])))
            for e in backends.engines
        ]
        for engine in engines:
            engine.GetLoad(engine_pb2.GetLoadRequest(), timeout=5)
        async with client_channel(router.address, ADMIN) as channel:
            call = inference_pb2_grpc.InferenceStub(channel).Generate(request(prompt(random.Random(4)), 3000))
            # Only the first token: the slow engine's link holds each message 300 ms while the engine
            # itself may finish the whole request (~2,000 tokens, the tiny model's context) in ~1.5 s.
            await call.read()
            loads = [engine.GetLoad(engine_pb2.GetLoadRequest(), timeout=5) for engine in engines]
            assert sum(load.running_requests for load in loads) == 1, loads
            call.cancel()
    await wait_for(engines_idle(backends.engines), 10)
    assert [s.in_flight for s in (await router.statuses()).values()] == [0, 0, 0]


async def test_load_accounting_returns_to_zero_after_a_burst_with_errors_and_cancellations(
    start_router: Callable[..., Router], backends: Backends
) -> None:
    router = start_router("--policy", "least_load")
    await wait_for(all_routable(router))
    rng = random.Random(5)
    outcomes: list[str] = []

    async def one(i: int, stub: inference_pb2_grpc.InferenceStub) -> None:
        kind = ("ok", "cancel", "invalid")[i % 3]
        max_new = 10**6 if kind == "invalid" else (2000 if kind == "cancel" else 16)
        call = stub.Generate(request(prompt(rng), max_new), timeout=60)
        try:
            if kind == "cancel":
                await call.read()
                call.cancel()
                outcomes.append("cancelled")
                return
            async for _ in call:
                pass
            outcomes.append("ok")
        except aio.AioRpcError as exc:
            outcomes.append(exc.code().name)

    async with client_channel(router.address, ADMIN) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        await asyncio.gather(*(one(i, stub) for i in range(24)))
    assert sorted(set(outcomes)) == ["INVALID_ARGUMENT", "cancelled", "ok"], outcomes
    await wait_for(engines_idle(backends.engines), 10)
    assert [s.in_flight for s in (await router.statuses()).values()] == [0, 0, 0]
    assert await router.admission() == (0, 0)


async def test_gateway_answers_429_when_full_and_503_without_engines(
    start_router: Callable[..., Router], backends: Backends
) -> None:
    full = start_router("--max-concurrent-requests", "1", "--max-queued-requests", "0")
    nothing = start_router(engines=[f"127.0.0.1:{free_port()}"])  # nothing listens there
    await wait_for(all_routable(full))
    body = {"input_ids": prompt(random.Random(6)), "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}

    async def gateway(address: str) -> Any:
        app = create_app(
            GatewayConfig(router_address=address, security=ServiceSecurity(internal_token=TEST_INTERNAL_TOKEN))
        )
        return app, app.router.lifespan_context(app)

    app, lifespan = await gateway(full.address)
    async with lifespan, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        engines = (await client.get("/v1/engines")).json()
        assert [e["health"] for e in engines["data"]] == ["healthy"] * 3
        long_one = asyncio.create_task(client.post("/generate", json=body, timeout=60))
        await wait_for(lambda: _active(full), 10)
        refused = await client.post("/generate", json={**body, "sampling_params": {"max_new_tokens": 2}})
        assert refused.status_code == 429, refused.text
        assert "max-concurrent-requests" in refused.json()["error"]["message"]
        long_one.cancel()
    app, lifespan = await gateway(nothing.address)
    async with lifespan, httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        started = time.monotonic()
        reply = await client.post("/generate", json=body)
        assert reply.status_code == 503 and reply.json()["error"]["message"], reply.text
        assert time.monotonic() - started < 5


async def _active(router: Router) -> bool:
    return (await router.admission())[0] == 1


def test_serve_starts_several_engines_behind_the_router(tiny_model_dir: Path, tmp_path: Path) -> None:
    flags = ["--engines", "2", "--engine-port", "0", "--policy", "round_robin"]
    stack = start_stack(tiny_model_dir, tmp_path / "stack.log", *flags)
    try:
        children = stack.child_pids()
        assert len(children) == 5, stack.log()  # two engines, tokenizer, router, gateway
        body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}}
        for _ in range(4):
            assert httpx.post(f"{stack.base_url}/generate", json=body, timeout=60).status_code == 200
        engines = httpx.get(f"{stack.base_url}/v1/engines", timeout=10).json()["data"]
        assert [e["health"] for e in engines] == ["healthy", "healthy"]
        assert [e["requests_total"] for e in engines] == [2, 2]
    finally:
        stack.stop()
    assert stack.process.returncode == 0, stack.log()


@dataclass
class Outcome:
    started: float
    had_output: bool = False
    finish: str = ""
    message: str = ""


async def test_killed_engine_under_load(start_router: Callable[..., Router], backends: Backends) -> None:
    """SIGKILL one engine under a steady load of concurrent streams: requests not yet started
    succeed on the others, streams running on it end with an abort naming it, nothing hangs,
    it is marked unhealthy; restarted, it gets traffic again."""
    flags = ["--policy", "round_robin", "--health-check-interval", "0.2", "--health-failure-threshold", "2"]
    # Straight to the three engines (no slow link): long streams keep every engine busy.
    router = start_router(*flags, "--health-success-threshold", "1", engines=[e.address for e in backends.engines])
    await wait_for(all_routable(router))
    victim = backends.engines[2]
    rng = random.Random(7)
    outcomes: list[Outcome] = []
    stop = asyncio.Event()

    async def client(stub: inference_pb2_grpc.InferenceStub) -> None:
        while not stop.is_set():
            outcome = Outcome(time.monotonic())
            outcomes.append(outcome)
            try:
                # Deadlines far above a stream's time on an idle machine: on a busy one it takes many times longer.
                async for response in stub.Generate(request(prompt(rng), 64), timeout=120):
                    if response.WhichOneof("kind") == "chunk":
                        outcome.had_output = True
                    else:
                        outcome.finish = response.complete.finish_reason.WhichOneof("kind")
                        outcome.message = response.complete.finish_reason.abort.message
            except aio.AioRpcError as exc:
                outcome.finish, outcome.message = f"error {exc.code().name}", exc.details() or ""

    async with client_channel(router.address, ADMIN) as channel:
        stub = inference_pb2_grpc.InferenceStub(channel)
        clients = [asyncio.create_task(client(stub)) for _ in range(9)]

        async def victim_streaming() -> bool:
            running = [o for o in outcomes if not o.finish]
            in_flight = (await router.statuses())[victim.address].in_flight
            return in_flight >= 2 and sum(o.had_output for o in running) >= 6

        await wait_for(victim_streaming, 20)
        victim.kill()
        killed_at = time.monotonic()
        await asyncio.sleep(2.5)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*clients), 150)  # nothing hangs

    before = [o for o in outcomes if o.started < killed_at]
    after = [o for o in outcomes if o.started > killed_at]
    assert after and all(o.finish == "length" for o in after), [(o.finish, o.message) for o in after]
    aborted = [o for o in before if o.finish == "abort"]
    assert aborted, "no stream was running on the killed engine"
    assert all(o.had_output and victim.address in o.message for o in aborted)
    assert all(o.finish in ("length", "abort") for o in before), [(o.finish, o.message) for o in before]
    assert (await router.statuses())[victim.address].health == UNHEALTHY

    victim.start().wait_healthy()
    await wait_for(all_routable(router))
    served_before = (await router.statuses())[victim.address].requests_total
    for _ in range(6):
        await router.generate(prompt(rng), max_new_tokens=2)
    assert (await router.statuses())[victim.address].requests_total == served_before + 2
