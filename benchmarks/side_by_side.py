"""One stream at a time through two checkouts' stacks at once (`bench_router --against REV`).

On a shared machine whose speed drifts by 2x from one minute to the next, "before" and "after" run
one after the other measure the drift. Here both stacks run at the same time and take turns in
blocks (A B, then B A, ...): each block sends `--against-block-requests` requests, one at a time,
down each of a stack's three paths (engine gRPC, router gRPC, gateway HTTP/SSE), the paths in a
rotating order. What a stack's gateway path adds is measured against that stack's own engine, and
the CPU each service spends per request comes from /proc over the gateway requests only.

The other checkout is a git revision (exported once into $TMPDIR/turnout-against/COMMIT and kept
there) or a folder holding one; either way it runs on this checkout's virtual environment, so the
dependencies are this checkout's (a dependency added since is used by both), and this checkout's
client must still speak its protos.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import service_ceiling
from benchmarks.bench_router import Arrivals, Serve, direct_stream, keeps_connections, raw_http_stream, router_stream
from benchmarks.http_stream import HttpConnection
from turnout.grpc_server import client_channel
from turnout.security import ClientCredentials
from turnout.v1 import engine_pb2_grpc, inference_pb2_grpc

CPU_COLUMNS = ("gateway", "router", "tokenizer", "engine")
PATH_NAMES = {"engine": "engine gRPC", "router": "router gRPC", "gateway": "gateway HTTP SSE + router"}


@dataclass
class Side:
    """One checkout's stack and what was measured on it."""

    label: str
    stack: Serve
    arrivals: dict[str, list[Arrivals]] = field(default_factory=lambda: {p: [] for p in PATH_NAMES})
    cpu_s: dict[str, float] = field(default_factory=lambda: dict.fromkeys(service_ceiling.SERVICES, 0.0))
    processes: dict[str, service_ceiling.ServiceProcesses] = field(default_factory=dict)


def checkout(against: str) -> tuple[Path, str]:
    """The other checkout's folder and label: a folder as given, a git revision exported once (`git archive`,
    protos generated) into a folder named by its commit and kept, so that a second run finds its CPU kernels built
    (they are built per folder: services/engine/cpu_kernels)."""
    given = Path(against)
    if given.is_dir():
        return given.resolve(), label_of(given)
    verify = ["git", "rev-parse", "--verify", "--quiet", f"{against}^{{commit}}"]
    found = subprocess.run(verify, capture_output=True, text=True, check=False)
    if found.returncode != 0:
        raise SystemExit(f"--against {against}: neither a folder nor a commit of this repository")
    commit = found.stdout.strip()
    root = Path(tempfile.gettempdir()) / "turnout-against" / commit
    done = root / ".exported"
    if not done.exists():
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", commit], capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(root, filter="data")
        subprocess.run([sys.executable, "-m", "turnout.protogen"], cwd=root, check=True)
        done.touch()
    return root, commit[:7]


def label_of(directory: Path) -> str:
    """The folder's commit, marked when its tracked files have changes."""
    found = subprocess.run(
        ["git", "-C", str(directory), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    )
    dirty = subprocess.run(
        ["git", "-C", str(directory), "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return (found.stdout.strip() or directory.name) + (" with changes" if dirty else "")


def _cpu(processes: dict[str, service_ceiling.ServiceProcesses]) -> dict[str, float]:
    return {name: service_ceiling.cpu_seconds(p) for name, p in processes.items()}


async def _block(side: Side, args: argparse.Namespace, rng: random.Random, first: int, measure: bool) -> None:
    """`--against-block-requests` requests down each path of `side`, one at a time, the paths starting at `first`."""
    stack, out = side.stack, args.single_output_len
    async with (
        client_channel(f"127.0.0.1:{stack.engine_port}", ClientCredentials(bearer=stack.token)) as engine_channel,
        client_channel(f"127.0.0.1:{stack.router_port}", ClientCredentials()) as router_channel,
    ):
        engine = engine_pb2_grpc.EngineStub(engine_channel)
        router = inference_pb2_grpc.InferenceStub(router_channel)
        http = HttpConnection(stack.port, keep_alive=keeps_connections(args))
        paths: dict[str, Callable[[list[int]], Awaitable[Arrivals]]] = {
            "engine": lambda p: direct_stream(engine, p, out),
            "router": lambda p: router_stream(router, p, out),
            "gateway": lambda p: raw_http_stream(http, p, out),
        }
        order = list(paths)
        order = order[first % 3 :] + order[: first % 3]
        for name in order:
            before = _cpu(side.processes)
            for _ in range(args.against_block_requests):
                # A prompt of its own each time: one seen before would be a prefix-cache hit.
                arrivals = await paths[name]([rng.randrange(100, 40000) for _ in range(args.prompt_len)])
                if measure:
                    side.arrivals[name].append(arrivals)
            if measure and name == "gateway":
                after = _cpu(side.processes)
                for service in side.cpu_s:
                    side.cpu_s[service] += after[service] - before[service]
        http.close()


def compare(args: argparse.Namespace, log: Path, extra: list[str]) -> list[str]:
    """Both stacks up at once, then `--against-blocks` rounds of one block each, the stacks taking turns going first."""
    here = Path.cwd()
    other, other_label = checkout(args.against)
    sides: list[Side] = []
    try:
        for directory, label in ((here, label_of(here)), (other, other_label)):
            sides.append(Side(label, Serve(args.model, 1, args.policy, log, extra, cwd=directory)))
        for side in sides:
            side.stack.wait_ready()
            side.processes = service_ceiling.service_processes(side.stack.process.pid)
        rng = random.Random(4000)
        for side in sides:
            asyncio.run(_block(side, args, rng, first=0, measure=False))  # warm-up
        for block in range(args.against_blocks):
            for side in sides if block % 2 == 0 else sides[::-1]:
                asyncio.run(_block(side, args, rng, first=block, measure=True))
    finally:
        for side in sides:
            side.stack.stop()
    return table(sides, args)


def table(sides: list[Side], args: argparse.Namespace) -> list[str]:
    requests = args.against_blocks * args.against_block_requests
    lines = [
        f"| checkout | path ({requests} requests each) | median TTFT (added) | median ITL (added) "
        "| CPU ms per request: gateway, router, tokenizer, engine |",
        "| --- | --- | --- | --- | --- |",
    ]
    added: dict[str, tuple[float, float | None]] = {}  # what the gateway path adds: TTFT, ITL (none for 1 token)
    for side in sides:
        ttft = {p: statistics.median(a.ttft for a in v) * 1e3 for p, v in side.arrivals.items()}
        gaps = {p: [g for a in v for g in a.gaps] for p, v in side.arrivals.items()}
        itl = {p: statistics.median(g) * 1e3 if g else None for p, g in gaps.items()}
        for path in PATH_NAMES:
            cpu = ""
            if path == "gateway":
                cpu = ", ".join(f"{side.cpu_s[s] / requests * 1e3:.2f}" for s in CPU_COLUMNS)
            lines.append(
                f"| {side.label} | {PATH_NAMES[path]} | {ttft[path]:.2f} ms ({ttft[path] - ttft['engine']:+.2f}) "
                f"| {_gap(itl[path], itl['engine'])} | {cpu} |"
            )
        gateway_itl, engine_itl = itl["gateway"], itl["engine"]
        added_itl = gateway_itl - engine_itl if gateway_itl is not None and engine_itl is not None else None
        added[side.label] = (ttft["gateway"] - ttft["engine"], added_itl)
    (head, (head_ttft, head_itl)), (base, (base_ttft, base_itl)) = added.items()
    summary = f"The gateway path adds, {head} against {base}: TTFT **{head_ttft:+.2f}** vs {base_ttft:+.2f} ms"
    if head_itl is not None and base_itl is not None:
        summary += f", ITL **{head_itl:+.2f}** vs {base_itl:+.2f} ms"
    return [*lines, "", summary + "."]


def _gap(itl: float | None, engine: float | None) -> str:
    """A path's median inter-token gap and what it adds to the engine's; a dash for 1-token outputs."""
    if itl is None or engine is None:
        return "-"
    return f"{itl:.2f} ms ({itl - engine:+.2f})"
