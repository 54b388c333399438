"""How long each service takes to start (docs/benchmarks.md, "A tokenizer without torch").

Each service is started on its own, `--repeats` times, as `turnout serve` starts it (`turnout
<service> ...`, the internal token in its environment); a start ends when the standard health
service says SERVING. Per start: wall seconds to SERVING, and the CPU seconds (every thread) and
resident memory of the process and its children at that moment (psutil). A restart after a crash
costs the same.

The router is given addresses nothing listens on: it serves (and waits for its backends) without
them, so its number is its own start alone. `serve` is the whole stack (`turnout serve`, what `make
serve` runs) until its ready line, with the CPU seconds and memory of the launcher and every child.

    python -m benchmarks.bench_startup [--model DIR] [--services tokenizer engine router serve]
        [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from turnout.child_processes import free_port, grpc_healthy
from turnout.ready_summary import READY_PREFIX
from turnout.security import INTERNAL_TOKEN_ENV

SERVICES = ("tokenizer", "engine", "router", "serve")
START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Start:
    wall_s: float
    cpu_s: float
    rss_mib: float
    torch_loaded: bool


def service_args(service: str, model: Path) -> list[str]:
    """The command line, less the port of what is measured."""
    if service == "serve":
        ports = ["--engine-port", "--tokenizer-port", "--router-port"]
        return ["serve", "--model", str(model), *(str(x) for flag in ports for x in (flag, free_port()))]
    return {
        "tokenizer": ["tokenizer", "--model", str(model)],
        "engine": ["engine", "--model", str(model), "--device", "cpu"],
        "router": ["router", "--tokenizer", "127.0.0.1:1", "--engine", "127.0.0.1:2"],
    }[service]


def _process_tree(pid: int) -> list[int]:
    """`pid` and its descendants."""
    return [pid, *(child.pid for child in psutil.Process(pid).children(recursive=True))]


def _started(service: str, port: int, log: Path, size_before: int) -> bool:
    if service == "serve":  # the launcher's line comes once every child is healthy
        with log.open("rb") as out:
            out.seek(size_before)
            return READY_PREFIX.encode() in out.read()
    return grpc_healthy(f"127.0.0.1:{port}")


def start_once(service: str, model: Path, log: Path) -> Start:
    port = free_port()
    argv = [sys.executable, "-m", "turnout.cli", *service_args(service, model), "--host", "127.0.0.1"]
    env = {**os.environ, INTERNAL_TOKEN_ENV: os.environ.get(INTERNAL_TOKEN_ENV, "bench-startup")}
    size_before = log.stat().st_size if log.exists() else 0
    started = time.monotonic()
    with log.open("ab") as out:
        process = subprocess.Popen([*argv, "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        while not _started(service, port, log, size_before):
            if process.poll() is not None:
                raise RuntimeError(f"{service} exited with {process.returncode}; see {log}")
            if time.monotonic() - started > START_TIMEOUT_S:
                raise TimeoutError(f"{service} not SERVING after {START_TIMEOUT_S:g} s; see {log}")
            time.sleep(0.05)
        wall_s = time.monotonic() - started
        cpu_s = rss_mib = 0.0
        torch_loaded = False
        for pid in _process_tree(process.pid):
            try:
                measured = psutil.Process(pid)
                with measured.oneshot():
                    times = measured.cpu_times()  # every thread
                    cpu_s += times.user + times.system
                    rss_mib += measured.memory_info().rss / 2**20
                torch_loaded = torch_loaded or any("libtorch" in m.path for m in measured.memory_maps())
            except psutil.NoSuchProcess:
                continue  # a short-lived helper that ended meanwhile
        return Start(wall_s, cpu_s, rss_mib, torch_loaded)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None, help="a model folder (default: the default model)")
    parser.add_argument("--services", nargs="+", choices=SERVICES, default=list(SERVICES))
    parser.add_argument("--repeats", type=int, default=3, help="starts per service")
    parser.add_argument(
        "--log",
        type=Path,
        default=Path(tempfile.gettempdir()) / "turnout-bench-startup.log",  # as bench_router's: not in the checkout
        help="the services' output",
    )
    args = parser.parse_args(argv)
    if args.model is None:
        from turnout.default_model import prepare_default_model

        args.model = prepare_default_model()
    print("| service | median s to SERVING | median CPU s | median RSS MiB | torch loaded |")  # serve: the tree
    print("| --- | --- | --- | --- | --- |")
    for service in args.services:
        starts = [start_once(service, args.model, args.log) for _ in range(args.repeats)]
        wall = statistics.median(s.wall_s for s in starts)
        cpu = statistics.median(s.cpu_s for s in starts)
        rss = statistics.median(s.rss_mib for s in starts)
        torch_loaded = (
            "yes"
            if all(s.torch_loaded for s in starts)
            else "no"
            if not any(s.torch_loaded for s in starts)
            else "sometimes"
        )
        print(f"| {service} | {wall:.2f} | {cpu:.2f} | {rss:.0f} | {torch_loaded} |", flush=True)


if __name__ == "__main__":
    main()
