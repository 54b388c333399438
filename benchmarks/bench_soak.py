"""Soak test of the whole stack: many mixed requests through `turnout serve`, nothing may break.

Starts the real stack (`turnout serve`, the default model unless `--model`), then sends
`--requests` requests (10,000 by default) from `--concurrency` clients at once over loopback:
completions and chat, streaming and not, `n` > 1, logprobs, stop strings, JSON schemas, clients
that hang up mid-stream, and requests that are invalid on purpose and must get a 4xx. Outputs are
short (`--max-tokens`) so the count, not the generation, is what is soaked.

Reports the outcomes (2xx, expected 4xx, unexpected 4xx or 2xx, 5xx, errors inside a 200 stream,
transport errors and timeouts), the throughput, and the resident memory of every service process
(the launcher's children) at the start, the middle and the end, flagging growth beyond noise.
Exits 1 on any 5xx, stream error, transport error or timeout (2 when `--time-limit` cut the run
short), then stops the stack.

    python -m benchmarks.bench_soak [--model PATH] [--requests 10000] [--concurrency 24]
    python -m benchmarks.bench_soak --model TINY_MODEL --smoke   # seconds: checks the script runs
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from turnout.child_processes import free_port

READY_LINE = b"Turnout is serving "
MIB = 1 << 20
# Growth from the middle to the end of the run beyond both of these is flagged: by the middle,
# caches and allocator arenas have warmed up, so steady growth after it is what a leak looks like.
RSS_NOISE_BYTES = 32 * MIB
RSS_NOISE_SHARE = 0.10
FAILURES = ("5xx", "stream error", "transport error", "timeout")
# Prompts are random picks of these (no tokenizer needed to make them).
WORDS = (  # noqa: SIM905
    "the quick brown fox jumps over a lazy dog while seven small birds sing about rivers mountains "
    "cities trains clocks letters numbers colors music bread water light stone paper garden window"
).split()


@dataclass(frozen=True)
class Call:
    """One request of the mix: what to send and what must come back."""

    kind: str
    path: str
    body: dict[str, object] | bytes
    stream: bool = False
    expect_error: bool = False
    # Read this many SSE events, then close the connection (a client that goes away).
    hang_up_after: int | None = None


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    by_kind: dict[str, Counter[str]] = field(default_factory=dict)
    # (kind, outcome) -> a few examples of what came back, for the report.
    samples: dict[tuple[str, str], list[str]] = field(default_factory=dict)

    def add(self, call: Call, outcome: str, detail: str = "") -> None:
        self.outcomes[outcome] += 1
        self.by_kind.setdefault(call.kind, Counter())[outcome] += 1
        if outcome in (*FAILURES, "unexpected 4xx", "unexpected 2xx"):
            examples = self.samples.setdefault((call.kind, outcome), [])
            if len(examples) < 3:
                examples.append(detail[:300])

    @property
    def done(self) -> int:
        return sum(self.outcomes.values())

    @property
    def failed(self) -> int:
        return sum(self.outcomes[name] for name in FAILURES)


def prompt(rng: random.Random, low: int = 4, high: int = 40) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def chat(rng: random.Random) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt(rng)}]


PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def make_mix(model: str, max_tokens: int) -> list[tuple[int, Callable[[random.Random], Call]]]:
    """(weight, builder) pairs; about one request in six is invalid on purpose."""
    completions, chats = "/v1/completions", "/v1/chat/completions"
    short = {"model": model, "max_tokens": max_tokens}

    def completion(rng: random.Random) -> Call:
        return Call("completion", completions, {**short, "prompt": prompt(rng), "temperature": 0.8})

    def completion_stream(rng: random.Random) -> Call:
        return Call("completion stream", completions, {**short, "prompt": prompt(rng), "stream": True}, stream=True)

    def completion_n_logprobs(rng: random.Random) -> Call:
        body = {**short, "prompt": prompt(rng), "n": 2, "logprobs": 2, "temperature": 1.0, "seed": rng.randrange(99)}
        return Call("completion n=2 logprobs", completions, body)

    def completion_stop(rng: random.Random) -> Call:
        body = {**short, "prompt": prompt(rng), "stop": [" the", "."], "max_tokens": 2 * max_tokens}
        return Call("completion stop strings", completions, body)

    def chat_plain(rng: random.Random) -> Call:
        return Call("chat", chats, {**short, "messages": chat(rng)})

    def chat_stream(rng: random.Random) -> Call:
        body = {**short, "messages": chat(rng), "stream": True, "stream_options": {"include_usage": True}}
        return Call("chat stream", chats, body, stream=True)

    def chat_n_stream(rng: random.Random) -> Call:
        body = {**short, "messages": chat(rng), "stream": True, "n": 2, "temperature": 0.9}
        return Call("chat stream n=2", chats, body, stream=True)

    def chat_logprobs(rng: random.Random) -> Call:
        return Call("chat logprobs", chats, {**short, "messages": chat(rng), "logprobs": True, "top_logprobs": 3})

    def chat_schema(rng: random.Random) -> Call:
        response_format = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA}}
        body = {**short, "messages": chat(rng), "response_format": response_format, "max_tokens": 2 * max_tokens}
        return Call("chat json schema", chats, body)

    def hang_up(rng: random.Random) -> Call:
        body = {**short, "messages": chat(rng), "stream": True, "max_tokens": 64, "ignore_eos": True}
        return Call("chat stream, client hangs up", chats, body, stream=True, hang_up_after=1)

    invalid_bodies: list[tuple[str, dict[str, object] | bytes]] = [
        ("negative temperature", {**short, "messages": [{"role": "user", "content": "hi"}], "temperature": -1}),
        ("max_tokens 0", {**short, "prompt": "hi", "max_tokens": 0}),
        ("n 0", {**short, "prompt": "hi", "n": 0}),
        ("top_p 2", {**short, "prompt": "hi", "top_p": 2}),
        ("logprobs 1000", {**short, "prompt": "hi", "logprobs": 1000}),
        ("no messages", {**short}),
        ("unknown model", {**short, "model": "no-such-model", "prompt": "hi"}),
        ("malformed JSON", b'{"model": "x", "prompt": '),
        ("bad schema", {**short, "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "x"}}),
    ]

    def invalid(rng: random.Random) -> Call:
        name, body = rng.choice(invalid_bodies)
        path = chats if isinstance(body, dict) and ("messages" in body or "prompt" not in body) else completions
        return Call(f"invalid: {name}", path, body, expect_error=True)

    return [
        (12, completion),
        (12, completion_stream),
        (6, completion_n_logprobs),
        (6, completion_stop),
        (12, chat_plain),
        (12, chat_stream),
        (6, chat_n_stream),
        (6, chat_logprobs),
        (6, chat_schema),
        (6, hang_up),
        (16, invalid),
    ]


async def send(client: httpx.AsyncClient, call: Call, tally: Tally, timeout_s: float) -> None:
    kwargs: dict[str, object] = {"content": call.body} if isinstance(call.body, bytes) else {"json": call.body}
    if isinstance(call.body, bytes):
        kwargs["headers"] = {"content-type": "application/json"}
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", call.path, **kwargs) as response:  # type: ignore[arg-type]
                status = response.status_code
                if status >= 500:
                    tally.add(call, "5xx", f"{status} {(await response.aread()).decode(errors='replace')}")
                    return
                if status >= 400:
                    text = (await response.aread()).decode(errors="replace")
                    tally.add(call, "expected 4xx" if call.expect_error else "unexpected 4xx", f"{status} {text}")
                    return
                if call.expect_error:
                    tally.add(call, "unexpected 2xx", (await response.aread()).decode(errors="replace"))
                    return
                if not call.stream:
                    await response.aread()
                    tally.add(call, "2xx")
                    return
                await read_stream(response, call, tally)
    except TimeoutError:
        tally.add(call, "timeout", f"no complete answer in {timeout_s}s")
    except httpx.HTTPError as exc:
        tally.add(call, "transport error", f"{type(exc).__name__}: {exc}")


async def read_stream(response: httpx.Response, call: Call, tally: Tally) -> None:
    """A 200 stream passes when it ends with [DONE] and carries no error event."""
    events = 0
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line.removeprefix("data: ")
        if data == "[DONE]":
            tally.add(call, "2xx")
            return
        if '"error"' in data and "error" in json.loads(data):
            tally.add(call, "stream error", data)
            return
        events += 1
        if call.hang_up_after is not None and events >= call.hang_up_after:
            tally.add(call, "2xx, hung up")
            return  # leaving the `stream` context closes the connection mid-stream
    tally.add(call, "stream error", f"stream ended without [DONE] after {events} events")


def _children_by_parent() -> dict[int, list[int]]:
    """Every process's direct children, from /proc (Linux)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name in parentheses may hold spaces: the fields after its last ")" are fixed.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    return parents


def child_pids(pid: int, parents: dict[int, list[int]] | None = None) -> list[int]:
    """All descendants of `pid`."""
    parents = _children_by_parent() if parents is None else parents
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def process_rss(pid: int) -> tuple[str, int] | None:
    """(name, resident bytes) of one process, named by its `turnout` subcommand; None once it is gone."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    name = next((arg for arg in argv if arg in ("serve", "engine", "tokenizer", "router", "gateway")), None)
    if name is None:  # a service's worker: `-m module` (template renderers) or `-c` (multiprocessing's spawn)
        if "-m" in argv[:-1]:
            name = argv[argv.index("-m") + 1]
        else:
            name = "multiprocessing worker" if "-c" in argv else argv[0]
    name = "launcher" if name == "serve" else name
    kib = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    return name, kib * 1024


def service_rss(launcher_pid: int) -> dict[str, int]:
    """Resident bytes of the launcher and each service process, named by its `turnout` subcommand."""
    rss: dict[str, int] = {}
    for pid in [launcher_pid, *child_pids(launcher_pid)]:
        found = process_rss(pid)
        if found is None:
            continue
        name, size = found
        key = name if name not in rss else f"{name} (pid {pid})"
        rss[key] = size
    return rss


def service_tree_rss(launcher_pid: int) -> dict[str, int]:
    """Resident bytes of each service of the launcher together with its own workers (grammar
    compilers, template renderers), named by the service."""
    parents = _children_by_parent()
    totals: dict[str, int] = {}
    for service in parents.get(launcher_pid, []):
        found = process_rss(service)
        if found is None:
            continue
        name = found[0]
        for pid in [service, *child_pids(service, parents)]:
            member = process_rss(pid)
            totals[name] = totals.get(name, 0) + (member[1] if member else 0)
    return totals


class Stack:
    """`turnout serve` as a child process in its own session; its log goes to a file."""

    def __init__(self, model: Path | None, log_path: Path, extra: list[str]) -> None:
        self.port = free_port()
        argv = [sys.executable, "-m", "turnout.cli", "serve", "--port", str(self.port), *extra]
        if model is not None:
            argv += ["--model", str(model)]
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout_s: float) -> str:
        """The served model's name, once the launcher says every service is up."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"turnout serve exited with {self.process.returncode}:\n{tail}")
            if READY_LINE in self.log_path.read_bytes():
                return str(httpx.get(f"{self.url}/v1/models", timeout=10).json()["data"][0]["id"])
            time.sleep(0.5)
        raise TimeoutError(f"the stack was not ready in {timeout_s}s (log: {self.log_path})")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log.close()


@dataclass
class Report:
    seconds: float
    tally: Tally
    rss: dict[str, dict[str, int]]  # moment -> process -> bytes
    stopped_early: bool

    def growth_flags(self) -> list[str]:
        middle, end = self.rss.get("middle", {}), self.rss.get("end", {})
        flags = []
        for name, after in end.items():
            before = middle.get(name)
            if before and after - before > max(RSS_NOISE_BYTES, RSS_NOISE_SHARE * before):
                flags.append(f"{name}: {before / MIB:.0f} -> {after / MIB:.0f} MiB from the middle to the end")
        return flags

    def markdown(self) -> str:
        tally = self.tally
        lines = [f"{tally.done} requests in {self.seconds:.0f} s: {tally.done / self.seconds:.1f} requests/s", ""]
        lines += ["| outcome | count |", "|---|---:|"]
        lines += [f"| {name} | {count} |" for name, count in sorted(tally.outcomes.items())]
        lines += ["", "| request kind | outcomes |", "|---|---|"]
        for kind, counts in sorted(tally.by_kind.items()):
            lines.append(f"| {kind} | {', '.join(f'{n} {o}' for o, n in sorted(counts.items()))} |")
        moments = [m for m in ("start", "middle", "end") if m in self.rss]
        lines += ["", f"| process | {' | '.join(f'RSS {m} (MiB)' for m in moments)} |"]
        lines.append("|---|" + "---:|" * len(moments))
        for name in self.rss.get("start", {}):
            cells = " | ".join(f"{self.rss[m].get(name, 0) / MIB:.0f}" for m in moments)
            lines.append(f"| {name} | {cells} |")
        flags = self.growth_flags()
        lines += ["", "RSS growth beyond noise: " + ("; ".join(flags) if flags else "none")]
        for (kind, outcome), examples in sorted(tally.samples.items()):
            lines.append(f"- {outcome} on {kind}: " + " | ".join(examples))
        if self.stopped_early:
            lines.append("- stopped early: --time-limit reached")
        return "\n".join(lines)


async def soak(url: str, model: str, args: argparse.Namespace, rss_now: Callable[[], dict[str, int]]) -> Report:
    rng = random.Random(args.seed)
    mix = make_mix(model, args.max_tokens)
    builders = [builder for _, builder in mix]
    weights = [weight for weight, _ in mix]
    calls = [rng.choices(builders, weights)[0](rng) for _ in range(args.requests)]
    tally = Tally()
    rss = {"start": rss_now()}
    deadline = time.monotonic() + args.time_limit
    next_call = iter(calls)
    halfway = args.requests // 2
    reported = [0]  # the last progress line's count (workers finish out of step: multiples get skipped)
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)

    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=args.request_timeout) as client:

        async def worker() -> None:
            for call in next_call:
                if time.monotonic() > deadline:
                    return
                await send(client, call, tally, args.request_timeout)
                if tally.done >= halfway and "middle" not in rss:
                    rss["middle"] = rss_now()
                if args.progress and tally.done >= reported[0] + args.progress:
                    reported[0] = tally.done - tally.done % args.progress
                    print(f"{tally.done} done, {dict(tally.outcomes)}", file=sys.stderr, flush=True)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        seconds = time.perf_counter() - start
    rss["end"] = rss_now()
    return Report(seconds, tally, rss, stopped_early=tally.done < args.requests)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_soak", description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="model folder (default: the default model)")
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=24, help="requests in flight at once")
    parser.add_argument("--max-tokens", type=int, default=4, help="max_tokens of most requests")
    parser.add_argument("--request-timeout", type=float, default=180.0, help="seconds before a request counts as hung")
    parser.add_argument("--time-limit", type=float, default=3 * 3600.0, help="stop sending after this many seconds")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--progress", type=int, default=500, help="print a line every N requests (0: never)")
    parser.add_argument("--smoke", action="store_true", help="120 requests, 8 at once: checks the script in seconds")
    parser.add_argument("serve_args", nargs="*", help="after --: more `turnout serve` flags")
    args = parser.parse_args(argv)
    if args.smoke:
        args.requests, args.concurrency, args.progress = 120, 8, 0
    return args


def run(args: argparse.Namespace) -> Report:
    """Start the stack, soak it, stop it (whatever happens)."""
    log_path = Path(tempfile.mkdtemp(prefix="bench_soak_")) / "serve.log"
    stack = Stack(args.model, log_path, args.serve_args)
    try:
        model = stack.wait_ready(args.startup_timeout)
        print(f"stack up at {stack.url} serving {model} (log: {log_path})", file=sys.stderr, flush=True)
        return asyncio.run(soak(stack.url, model, args, lambda: service_rss(stack.process.pid)))
    finally:
        stack.stop()


def main(argv: list[str] | None = None) -> int:
    report = run(parse_args(argv))
    print(report.markdown())
    if report.tally.failed:
        return 1
    return 2 if report.stopped_early else 0


if __name__ == "__main__":
    sys.exit(main())
