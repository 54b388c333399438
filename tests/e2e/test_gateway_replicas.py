"""`turnout serve --api-server-count 2`: two gateway processes on one HTTP port, one metrics page and
one responses store between them; one of them killed leaves the port served."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.stack import Stack, start_stack
from turnout.gateway_replicas import MULTIPROC_DIR_ENV

pytestmark = pytest.mark.e2e

COMPLETION = {"prompt": "Hello", "max_tokens": 2}
# Generous: a restarted gateway imports its modules on a busy machine.
RESTART_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = start_stack(tiny_model_dir, tmp_path_factory.mktemp("replicas") / "stack.log", "--api-server-count", "2")
    yield stack
    stack.stop()


def gateways(stack: Stack) -> dict[int, dict[str, str]]:
    """The launcher's gateway children: pid -> environment."""
    found = {}
    for pid in stack.child_pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if b"gateway" in argv:
            found[pid] = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
    return found


def requests_total(stack: Stack, route: str) -> float:
    page = httpx.get(f"{stack.base_url}/metrics", timeout=30).text
    prefix = f'turnout_gateway_requests_total{{method="POST",route="{route}",status="200"}} '
    return sum(float(line.removeprefix(prefix)) for line in page.splitlines() if line.startswith(prefix))


def test_two_gateways_answer_on_one_port_with_one_metrics_page(stack: Stack) -> None:
    running = gateways(stack)
    assert len(running) == 2, stack.log()
    folders = {env[MULTIPROC_DIR_ENV] for env in running.values()}
    assert len(folders) == 1, running
    model = httpx.get(f"{stack.base_url}/v1/models", timeout=30).json()["data"][0]["id"]
    before = requests_total(stack, "/v1/completions")
    for _ in range(6):
        reply = httpx.post(f"{stack.base_url}/v1/completions", json={"model": model, **COMPLETION}, timeout=60)
        assert reply.status_code == 200, reply.text
    # Whichever gateway served them and whichever one answers the scrape, the page counts all six.
    assert requests_total(stack, "/v1/completions") == before + 6
    # Each gateway writes its own series into the shared folder (both were probed for health at start).
    written = {name.split("_")[-1].removesuffix(".db") for name in os.listdir(next(iter(folders)))}
    assert {str(pid) for pid in running} <= written, written


def test_a_killed_gateway_leaves_the_port_served_and_the_store_kept(stack: Stack) -> None:
    model = httpx.get(f"{stack.base_url}/v1/models", timeout=30).json()["data"][0]["id"]
    stored = httpx.post(
        f"{stack.base_url}/v1/responses", json={"model": model, "input": "Hi", "max_output_tokens": 2}, timeout=60
    ).json()
    running = gateways(stack)
    victim = min(running)
    os.kill(victim, signal.SIGKILL)
    # At once, while it is dead and being restarted: the other gateway takes every connection.
    for _ in range(10):
        reply = httpx.post(f"{stack.base_url}/v1/completions", json={"model": model, **COMPLETION}, timeout=60)
        assert reply.status_code == 200, reply.text
        again = httpx.get(f"{stack.base_url}/v1/responses/{stored['id']}", timeout=30)
        assert again.status_code == 200 and again.json() == stored
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while len(gateways(stack)) < 2 or victim in gateways(stack):
        assert time.monotonic() < deadline, f"the killed gateway was not restarted\n{stack.log()}"
        time.sleep(0.5)


def test_stopping_the_stack_removes_what_the_gateways_shared(stack: Stack) -> None:
    folder = Path(next(iter(gateways(stack).values()))[MULTIPROC_DIR_ENV]).parent
    assert folder.is_dir()
    stack.stop(timeout_s=30)
    assert stack.process.returncode == 0, stack.log()[-4000:]
    assert not folder.exists()
