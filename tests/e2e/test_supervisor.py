"""`turnout serve` is a supervisor, not a fuse: a child that dies is restarted while the others
keep serving, clients see a clear error at most (never a refused connection), a crash loop stops
the stack, and SIGTERM stops everything without SIGKILL.

The module's stack (two tiny engines) loses an engine, then the tokenizer, then the router, under
a dozen concurrent HTTP clients, and is stopped with SIGTERM last. Deadlines are generous: the
machine running this may be small and busy.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.e2e.services import Service
from tests.e2e.stack import Stack, start_stack

pytestmark = pytest.mark.e2e

# Generous: a restarted engine imports torch and loads its model on a busy machine.
RESTART_TIMEOUT_S = 180.0
CLIENTS = 12
# Bound on the requests of one load run.
MAX_REQUESTS = 300


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # A 5 s backoff: the router marks the dead engine unhealthy before it is back.
    flags = ["--engines", "2", "--engine-port", "0", "--policy", "round_robin", "--metrics", "--restart-backoff", "5"]
    stack = start_stack(tiny_model_dir, tmp_path_factory.mktemp("supervisor") / "stack.log", *flags)
    yield stack
    stack.stop()


def children(stack: Stack) -> dict[str, int]:
    """The launcher's children by service: engine ports are told apart as `engine:PORT`."""
    named: dict[str, int] = {}
    for pid in stack.child_pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        args = [a.decode() for a in argv]
        service = args[args.index("turnout.cli") + 1]
        if service == "engine":
            service = f"engine:{args[args.index('--port') + 1]}"
        named[service] = pid
    return named


def wait_until(condition: Callable[[], object], timeout_s: float, what: str, stack: Stack) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            result = condition()
        except (httpx.HTTPError, OSError, KeyError, ValueError):
            result = None
        if result:
            return result
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {timeout_s:g} s\n{stack.log()}")


def launcher_records(stack: Stack, message: str) -> list[dict[str, object]]:
    """The launcher's JSON log lines with this message (children log in the same file)."""
    records = []
    for line in stack.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"message": "{message}"' in line:
            record = json.loads(line)
            if record.get("service") == "launcher":
                records.append(record)
    return records


def engines(stack: Stack) -> list[dict[str, object]]:
    reply = httpx.get(f"{stack.base_url}/v1/engines", timeout=10)
    reply.raise_for_status()
    data: list[dict[str, object]] = reply.json()["data"]
    return data


@dataclass
class Outcome:
    started: float
    status: int = 0
    # For 200s: whether it finished; else the error message (JSON body, or an SSE error event).
    error: str = ""
    transport_error: str = ""


async def _one(client: httpx.AsyncClient, stream: bool) -> Outcome:
    outcome = Outcome(time.monotonic())
    body = {"prompt": "hello there", "max_tokens": 24, "temperature": 0, "stream": stream}
    try:
        if not stream:
            reply = await client.post("/v1/completions", json=body)
            outcome.status = reply.status_code
            if reply.status_code != 200:
                outcome.error = reply.json()["error"]["message"]
            return outcome
        async with client.stream("POST", "/v1/completions", json=body) as reply:
            outcome.status = reply.status_code
            if reply.status_code != 200:
                outcome.error = json.loads(await reply.aread())["error"]["message"]
                return outcome
            async for line in reply.aiter_lines():
                if line.startswith("data: {") and '"error"' in line:
                    outcome.error = json.loads(line[6:])["error"]["message"]
    except httpx.TransportError as exc:
        outcome.transport_error = f"{type(exc).__name__}: {exc}"
    return outcome


async def _load(stack: Stack, done: Callable[[list[Outcome]], bool]) -> list[Outcome]:
    """Requests from CLIENTS concurrent clients, half of them streaming, until `done(outcomes)`."""
    outcomes: list[Outcome] = []
    limits = httpx.Limits(max_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=stack.base_url, timeout=120, limits=limits) as client:

        async def worker(index: int) -> None:
            while not done(outcomes):
                outcome = await _one(client, stream=(len(outcomes) + index) % 2 == 0)
                outcomes.append(outcome)
                # A little spacing: the test is about faults, not throughput.
                await asyncio.sleep(0.05)

        await asyncio.gather(*(worker(i) for i in range(CLIENTS)))
    return outcomes


def run_load_and_kill(stack: Stack, victim: str, kill_after: int, then: int) -> tuple[list[Outcome], float]:
    """SIGKILL the `victim` child once `kill_after` requests have ended, and go on until `then` more
    requests that started a second after the kill have ended (at most MAX_REQUESTS in all)."""
    pid = children(stack)[victim]
    killed_at = 0.0

    def done(outcomes: list[Outcome]) -> bool:
        nonlocal killed_at
        if len(outcomes) >= kill_after and not killed_at:
            killed_at = time.monotonic()
            os.kill(pid, signal.SIGKILL)
        after = sum(o.started > killed_at + 1 for o in outcomes) if killed_at else 0
        return after >= then or len(outcomes) >= MAX_REQUESTS

    outcomes = asyncio.run(_load(stack, done))
    assert killed_at, "the victim was never killed"
    ok = sum(o.status == 200 and not o.error for o in outcomes)
    print(f"{victim} killed: {len(outcomes)} requests, {ok} complete, {len(outcomes) - ok} clear errors")
    return outcomes, killed_at


def assert_clear_outcomes(outcomes: list[Outcome], stack: Stack) -> None:
    """No refused connection, no broken transport; each request 200 or a 503 with a JSON message."""
    transport = [o.transport_error for o in outcomes if o.transport_error]
    assert not transport, f"{transport[:5]}\n{stack.log()}"
    statuses = {o.status for o in outcomes}
    assert statuses <= {200, 503}, [(o.status, o.error) for o in outcomes if o.status not in (200, 503)]
    for o in outcomes:
        if o.error:
            assert "connection refused" not in o.error.lower(), o.error
    assert all(o.error for o in outcomes if o.status == 503)


def restarted(stack: Stack, victim: str, old_pid: int) -> int:
    """The victim's new pid, once the launcher has started it again."""
    pid = wait_until(
        lambda: children(stack).get(victim, old_pid) != old_pid and children(stack)[victim],
        RESTART_TIMEOUT_S,
        f"{victim} restarted",
        stack,
    )
    assert isinstance(pid, int)
    return pid


def serves(stack: Stack) -> bool:
    body = {"prompt": "hi", "max_tokens": 2}
    return httpx.post(f"{stack.base_url}/v1/completions", json=body, timeout=60).status_code == 200


def restart_count(stack: Stack, child: str) -> float:
    url = re.search(rb"launcher metrics: (\S+)", stack.log_path.read_bytes())
    assert url is not None, stack.log()
    text = httpx.get(url.group(1).decode(), timeout=10).text
    found = re.search(rf'turnout_launcher_child_restarts_total{{child="{child}"}} (\S+)', text)
    assert found is not None, text
    return float(found.group(1))


def test_a_killed_engine_costs_only_its_requests_and_comes_back(stack: Stack) -> None:
    before = children(stack)
    engine_names = sorted(name for name in before if name.startswith("engine:"))
    assert len(engine_names) == 2 and len(before) == 5, before
    victim = engine_names[0]
    victim_address = f"127.0.0.1:{victim.split(':')[1]}"

    outcomes, killed_at = run_load_and_kill(stack, victim, kill_after=30, then=40)

    assert_clear_outcomes(outcomes, stack)
    after = [o for o in outcomes if o.started > killed_at + 1]
    assert sum(o.status == 200 and not o.error for o in after) >= 20, "traffic did not continue on the survivor"

    # While the victim is down, /v1/engines shows it unhealthy with no load, not its last report.
    def victim_unhealthy() -> dict[str, object] | None:
        return next((e for e in engines(stack) if e["address"] == victim_address and e["health"] == "unhealthy"), None)

    status = wait_until(
        victim_unhealthy,
        RESTART_TIMEOUT_S,
        "the dead engine marked unhealthy",
        stack,
    )
    assert isinstance(status, dict)
    assert (status["running_requests"], status["waiting_requests"], status["load"], status["in_flight"]) == (
        0,
        0,
        0,
        0,
    ), status
    assert status["routable"] is False

    restarted(stack, victim, before[victim])
    wait_until(
        lambda: all(e["health"] == "healthy" and e["routable"] for e in engines(stack)),
        RESTART_TIMEOUT_S,
        "the restarted engine rejoins",
        stack,
    )
    served_before = next(e["requests_total"] for e in engines(stack) if e["address"] == victim_address)
    for _ in range(4):
        assert serves(stack)
    served_after = next(e["requests_total"] for e in engines(stack) if e["address"] == victim_address)
    assert isinstance(served_before, int) and isinstance(served_after, int)
    assert served_after >= served_before + 2  # round robin over the two
    assert {k: v for k, v in children(stack).items() if k != victim} == {
        k: v for k, v in before.items() if k != victim
    }, "another service was restarted too"
    [restart] = launcher_records(stack, "child died; restarting it")
    assert restart["child"] in ("engine0", "engine1")
    assert [restart[k] for k in ("signal", "attempt", "backoff_s")] == ["SIGKILL", 1, 5]
    assert restart_count(stack, str(restart["child"])) == 1
    assert restart_count(stack, "engine1" if restart["child"] == "engine0" else "engine0") == 0


@pytest.mark.parametrize("victim", ["tokenizer", "router"])
def test_a_killed_tokenizer_or_router_is_restarted_with_clear_errors_meanwhile(stack: Stack, victim: str) -> None:
    wait_until(lambda: serves(stack), RESTART_TIMEOUT_S, "serving", stack)
    before = children(stack)

    outcomes, _ = run_load_and_kill(stack, victim, kill_after=12, then=24)

    assert_clear_outcomes(outcomes, stack)
    restarted(stack, victim, before[victim])
    wait_until(lambda: serves(stack), RESTART_TIMEOUT_S, "serving again", stack)
    assert restart_count(stack, victim) == 1


def test_sigterm_stops_every_child_without_sigkill(stack: Stack) -> None:
    pids = list(children(stack).values())
    took = stack.stop(timeout_s=30)
    log = stack.log_path.read_text(errors="replace")
    assert stack.process.returncode == 0, log[-4000:]
    assert took < 10, f"stopping took {took:.1f} s"
    assert "ignored SIGTERM" not in log
    stopped = {r["child"]: r["returncode"] for r in launcher_records(stack, "child stopped")}
    assert len(stopped) == len(pids) and set(stopped.values()) == {0}, stopped
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]


def test_a_crash_loop_stops_the_stack(tiny_model_dir: Path, tmp_path: Path) -> None:
    flags = ["--max-restarts", "1", "--restart-window", "600", "--restart-backoff", "0.2"]
    stack = start_stack(tiny_model_dir, tmp_path / "stack.log", *flags)
    try:
        first = children(stack)
        os.kill(first["tokenizer"], signal.SIGKILL)
        second = restarted(stack, "tokenizer", first["tokenizer"])
        os.kill(second, signal.SIGKILL)
        stack.process.wait(timeout=60)
    finally:
        stack.stop()
    log = stack.log_path.read_text(errors="replace")
    assert stack.process.returncode == 1, log[-4000:]
    assert len(re.findall("giving up: tokenizer died again after 1 restarts within 600 s", log)) == 1, log[-4000:]
    assert not [pid for pid in first.values() if Path(f"/proc/{pid}").exists()]


@pytest.mark.parametrize("service", ["engine", "tokenizer", "router"])
def test_each_service_exits_0_on_sigterm_well_within_its_grace(
    service: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = {
        "engine": ["engine", "--model", str(tiny_model_dir), "--device", "cpu", "--num-kv-blocks", "64"],
        "tokenizer": ["tokenizer", "--model", str(tiny_model_dir)],
        "router": ["router", "--tokenizer", "127.0.0.1:1", "--engine", "127.0.0.1:2"],
    }[service]
    process = Service(service, args, tmp_path / f"{service}.log").start().wait_healthy(timeout_s=180)
    assert process.process is not None
    started = time.monotonic()
    process.process.terminate()
    returncode = process.process.wait(timeout=30)
    took = time.monotonic() - started
    assert returncode == 0, process.log()
    # The grace for requests in flight is 5 s; with none, stopping takes well under it.
    assert took < 5, f"{service} took {took:.1f} s to exit"
