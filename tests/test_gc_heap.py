"""Service processes freeze their startup heap once built and collect their young objects less often
(turnout/gc_heap.py), and unfreeze the heap at exit."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import textwrap
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from turnout.child_processes import free_port
from turnout.gc_heap import YOUNG_COLLECTION_THRESHOLD, frozen_heap

# A gRPC service with nothing but health, served by turnout.grpc_server.serve as every service is; on
# stop it prints how many objects were frozen and its young generation's threshold.
SERVICE = """
import asyncio, gc, sys
from turnout.grpc_server import serve

async def report():
    print("frozen", gc.get_freeze_count(), flush=True)
    print("threshold", gc.get_threshold()[0], flush=True)

asyncio.run(serve(sys.argv[1], [], on_stop=report, grace_s=0.1))
"""

# What the interpreter sees at exit: atexit runs its handlers last-registered first, so this one,
# registered before the freeze, runs after the unfreeze that freezing registered.
AT_EXIT = """
import atexit, gc
from turnout.gc_heap import freeze_startup_heap

atexit.register(lambda: print("at exit", gc.get_freeze_count(), flush=True))
freeze_startup_heap()
freeze_startup_heap()  # a second freeze adds to the first and registers nothing more
print("after freeze", gc.get_freeze_count(), flush=True)
"""


def test_a_grpc_service_serves_with_its_startup_heap_frozen() -> None:
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [sys.executable, "-c", SERVICE, address], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deadline = time.monotonic() + 120  # a start that hangs, not a timing
        with grpc.insecure_channel(address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                assert time.monotonic() < deadline and process.poll() is None, "the service never became healthy"
                try:
                    if health.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                        break
                except grpc.RpcError:
                    time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=60)[0]
    finally:
        process.kill()
    frozen = [int(line.split()[1]) for line in output.splitlines() if line.startswith("frozen ")]
    # grpc, protobuf and asyncio alone are tens of thousands of objects.
    assert frozen and frozen[0] > 10_000, output[-2000:]
    assert f"threshold {YOUNG_COLLECTION_THRESHOLD}" in output.splitlines()


def test_the_heap_is_unfrozen_at_exit() -> None:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(AT_EXIT)], capture_output=True, text=True, timeout=120, check=True
    )
    lines = dict(line.rsplit(" ", 1) for line in done.stdout.splitlines())
    assert int(lines["after freeze"]) > 0
    assert lines["at exit"] == "0"


def test_a_measurement_freezes_the_heap_until_it_ends() -> None:
    assert gc.get_freeze_count() == 0
    before = gc.get_threshold()
    with frozen_heap():
        assert gc.get_freeze_count() > 10_000  # pytest and what the tests imported
        assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, *before[1:])
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
