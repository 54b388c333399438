"""Every service's event loop is uvloop's (a dependency), and grpc.aio servers and channels work on it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from turnout.event_loop import install_event_loop_policy

uvloop = pytest.importorskip("uvloop", reason="uvloop is a dependency (pyproject.toml): `make install` adds it")


@pytest.fixture
def uvloop_policy() -> Iterator[None]:
    assert install_event_loop_policy() == "uvloop"
    yield
    asyncio.set_event_loop_policy(None)


async def _health_over_grpc() -> tuple[type, list[int]]:
    """A grpc.aio server and a channel on this loop: unary calls and a server stream."""
    server = aio.server()
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            statuses = [(await stub.Check(health_pb2.HealthCheckRequest())).status for _ in range(20)]
            watch = stub.Watch(health_pb2.HealthCheckRequest())
            statuses.append((await watch.read()).status)
            await servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
            statuses.append((await watch.read()).status)
            watch.cancel()
    finally:
        await server.stop(0)
    return type(asyncio.get_running_loop()), statuses


def test_grpc_aio_runs_on_uvloop(uvloop_policy: None) -> None:
    loop_type, statuses = asyncio.run(_health_over_grpc())
    assert loop_type is uvloop.Loop
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    assert statuses == [serving] * 21 + [not_serving]


def test_the_turnout_command_runs_its_services_on_uvloop() -> None:
    """`turnout.cli` sets the policy before any command creates its loop (the services call asyncio.run)."""
    # A command that reports the loop asyncio.run gives it, in place of the parsed service command.
    script = """
import argparse, asyncio
import turnout.cli as cli

async def loop_module():
    return type(asyncio.get_running_loop()).__module__

command = argparse.Namespace(run=lambda args: print(asyncio.run(loop_module())))
cli.build_parser = lambda: argparse.Namespace(parse_args=lambda argv: command)
cli.main(["router"])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "uvloop"
