"""Where a served token's CPU goes, per process of the running stack (issues 19 and 15).

Starts `turnout serve` as bench_peers does, warms it up, then runs one workload with the built-in
streaming client while reading each service process's CPU time (/proc/<pid>/stat, user + system)
before and after: CPU ms per output token and cores used, per service. With `--py-spy` it also
samples the engine process meanwhile (py-spy record --pid, installed into the peers' venv when
missing) and prints the leaf Python frames where the samples land, per thread.

    python -m benchmarks.profile_served [--precision bfloat16] [--workload c1] [--num-prompts 8] [--py-spy]

An engine whose CPU per token is far above its step time, or services whose share grows with
concurrency, say where to look; run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.bench_peers import WORKLOADS
from benchmarks.peer_client import builtin_client
from benchmarks.peer_servers import turnout_server
from benchmarks.py_spy import py_spy
from turnout.default_model import default_model_dir

SERVICES = ("engine", "router", "tokenizer", "gateway")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()  # fields after "pid (comm)": state is [0]


def service_pids(root: int) -> dict[str, int]:
    """The stack's service processes under `root` (the `turnout serve` launcher), by service name."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int(_stat(int(entry.name))[1])
            except (OSError, ValueError, IndexError):
                continue
    found: dict[str, int] = {}
    for pid in parents:
        ancestor = parents.get(pid)
        while ancestor not in (None, 0, 1, root):
            ancestor = parents.get(ancestor)  # type: ignore[arg-type]
        if ancestor != root:
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if "turnout.cli" in words:
            command = words[words.index("turnout.cli") + 1]
            if command in SERVICES:
                found[command] = pid
    return found


def cpu_seconds(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime


def spy_summary(raw: Path, top: int) -> list[str]:
    """Leaf Python frames of py-spy's raw output, per thread, as printable lines."""
    by_thread: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        frames = stack.split(";")
        thread = frames[0] if frames and frames[0].startswith("thread") else "all"
        leaf = next((f for f in reversed(frames) if ".py:" in f), frames[-1])
        by_thread[thread][leaf] += int(samples)
    lines = []
    for thread, leaves in sorted(by_thread.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(leaves.values())
        lines.append(f"{thread}: {total} samples")
        lines += [f"  {100 * n / total:5.1f}%  {frame}" for frame, n in leaves.most_common(top)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--precision", default="bfloat16")
    parser.add_argument("--workload", default="c1", choices=sorted(WORKLOADS))
    parser.add_argument("--num-prompts", type=int, default=None, help="requests (default: the workload's)")
    parser.add_argument("--py-spy", action="store_true", help="also sample the engine process with py-spy")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    model = args.model or default_model_dir()
    workload = WORKLOADS[args.workload]
    if args.workload == "prefix":
        parser.error("the built-in client has no shared-prefix dataset; use c1, c16 or c64")
    if args.num_prompts:
        workload = replace(workload, num_prompts=args.num_prompts)
    server = turnout_server(model, args.precision)
    with tempfile.TemporaryDirectory() as tmp:
        server.start(Path(tmp))
        try:
            assert server.process is not None
            pids = service_pids(server.process.pid)
            builtin_client(server, replace(workload, num_prompts=2, concurrency=1))  # warm-up
            spy = None
            raw = Path(tmp) / "engine.txt"
            if args.py_spy:
                record = [str(py_spy()), "record", "--pid", str(pids["engine"]), "--rate", "200", "--threads"]
                spy = subprocess.Popen([*record, "--format", "raw", "--output", str(raw)], stderr=subprocess.DEVNULL)
                time.sleep(1)
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            started = time.monotonic()
            result = builtin_client(server, workload)
            wall = time.monotonic() - started
            after = {name: cpu_seconds(pid) for name, pid in pids.items()}
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(timeout=60)
        finally:
            server.stop()
        print(f"turnout {args.precision}, {workload.name}, {workload.num_prompts} requests: ", end="")
        print(f"{result.output_throughput:.1f} tok/s, median TTFT {result.median_ttft_ms:.0f} ms, ", end="")
        print(f"TPOT {result.median_tpot_ms:.1f} ms")
        print("| service | CPU s | cores used | CPU ms per output token |")
        print("| --- | --- | --- | --- |")
        for name in SERVICES:
            if name in before:
                used = after[name] - before[name]
                per_token = 1000 * used / max(result.output_tokens, 1)
                print(f"| {name} | {used:.1f} | {used / wall:.2f} | {per_token:.2f} |")
        if spy is not None and raw.exists():
            print("\n".join(spy_summary(raw, args.top)))


if __name__ == "__main__":
    main()
