"""Tensor parallelism through real services: `turnout serve --tensor-parallel-size 2` on 2 gloo
ranks, and a router that loses a 2-rank engine's second rank and keeps serving with another engine."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.e2e.services import Service
from tests.e2e.stack import start_stack
from tests.e2e.test_router_engines import HEALTHY, Router, prompt, stop_all, wait_for
from turnout import LLM

pytestmark = pytest.mark.e2e

ENGINE_FLAGS = ["--device", "cpu", "--dtype", "float32", "--num-kv-blocks", "128", "--max-model-len", "1024"]
PROMPTS = ["The capital of France is", "Once upon a time there"]


def workers_of(pid: int) -> list[psutil.Process]:
    """The tensor-parallel ranks started under `pid`, at any depth."""
    return [p for p in psutil.Process(pid).children(recursive=True) if "services.engine.parallel.worker" in p.cmdline()]


def test_serve_with_two_ranks_gives_one_ranks_greedy_text_and_stops_every_rank(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with LLM(tiny_model_dir, device="cpu", dtype="float32", num_kv_blocks=128) as one:
        expected = [o.text for o in one.generate(PROMPTS, {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True})]
    stack = start_stack(tiny_model_dir, tmp_path / "stack.log", "--tensor-parallel-size", "2", *ENGINE_FLAGS)
    try:
        workers = workers_of(stack.process.pid)
        assert len(workers) == 1, stack.log()
        for text_prompt, text in zip(PROMPTS, expected, strict=True):
            body = {"prompt": text_prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
            reply = httpx.post(f"{stack.base_url}/v1/completions", json=body, timeout=120)
            assert reply.status_code == 200, reply.text
            assert reply.json()["choices"][0]["text"] == text
    finally:
        stack.stop(timeout_s=60)
    assert stack.process.returncode == 0, stack.log()
    # Stopped, not lost or killed: rank 0 sent its shutdown message before its step thread (the rank's
    # parent, whose end would SIGKILL it) ended, and rank 1 left its loop.
    log = stack.log_path.read_text(errors="replace")
    assert "rank lost" not in log
    assert re.search(r'tensor parallel ranks stopped.*"exit_codes": \[0\]', log), log[-3000:]
    _, alive = psutil.wait_procs(workers, timeout=5)
    assert not alive, "SIGTERM to the stack left a tensor-parallel rank running"


@pytest.fixture
def two_engines(tiny_model_dir: Path, tmp_path: Path) -> Iterator[tuple[Service, Service, Router]]:
    """Engine 0 runs on 2 ranks, engine 1 on one; a router in front of both."""
    model = ["--model", str(tiny_model_dir)]
    parallel = Service("tp-engine", ["engine", *model, *ENGINE_FLAGS, "--tp-size", "2"], tmp_path / "tp.log")
    single = Service("engine", ["engine", *model, *ENGINE_FLAGS], tmp_path / "engine.log")
    tokenizer = Service("tokenizer", ["tokenizer", *model], tmp_path / "tokenizer.log")
    services = [parallel, single, tokenizer]
    try:
        for service in services:
            service.start()
        for service in services:
            service.wait_healthy()
        flags = ["--policy", "round_robin", "--health-check-interval", "0.2", "--health-failure-threshold", "2"]
        args = ["router", "--tokenizer", tokenizer.address, *flags, "--engine", parallel.address]
        router = Service("router", [*args, "--engine", single.address], tmp_path / "router.log").start()
        services.append(router)
        router.wait_healthy()
        yield parallel, single, Router(router)
    finally:
        stop_all(services)


async def test_a_dead_rank_takes_its_engine_out_of_the_pool_and_the_router_serves_on(
    two_engines: tuple[Service, Service, Router],
) -> None:
    parallel, single, router = two_engines

    async def both_healthy() -> bool:
        return all(s.health == HEALTHY for s in (await router.statuses()).values())

    await wait_for(both_healthy, 60)
    rng = random.Random(3)
    for _ in range(4):  # round robin: both engines serve
        responses = await router.generate(prompt(rng), max_new_tokens=4)
        assert responses[-1].complete.finish_reason.WhichOneof("kind") == "length"
    assert parallel.process is not None
    [worker] = workers_of(parallel.process.pid)
    worker.kill()
    started = time.monotonic()
    # Rank 0 notices, stops serving (NOT_SERVING) and exits non-zero: no hang, no zombie rank.
    code = await asyncio.to_thread(parallel.process.wait, 60)
    assert code != 0 and time.monotonic() - started < 60
    assert "tensor parallel rank 1" in parallel.log()

    async def only_single_routable() -> bool:
        statuses = await router.statuses()
        return not statuses[parallel.address].routable and statuses[single.address].routable

    await wait_for(only_single_routable, 30)
    served = (await router.statuses())[single.address].requests_total
    for _ in range(4):
        responses = await router.generate(prompt(rng), max_new_tokens=4)
        assert responses[-1].complete.finish_reason.WhichOneof("kind") == "length"
    assert (await router.statuses())[single.address].requests_total == served + 4


def test_a_sigkilled_engine_leaves_no_rank_behind(tiny_model_dir: Path, tmp_path: Path) -> None:
    args = ["engine", "--model", str(tiny_model_dir), *ENGINE_FLAGS, "--tp-size", "2"]
    engine = Service("tp-engine", args, tmp_path / "tp.log").start()
    try:
        engine.wait_healthy()
        assert engine.process is not None
        workers = workers_of(engine.process.pid)
        assert len(workers) == 1
        engine.kill()  # no graceful stop: the worker goes with it (PR_SET_PDEATHSIG; on gloo its socket closes too)
        _, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive
    finally:
        engine.stop()
