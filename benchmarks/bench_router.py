"""Router benchmarks on this machine: what the gateway + router cost, and what more engines give.

1. overhead: the same streams (token-id prompts, greedy, ignore_eos) sent straight to one
   engine's gRPC `Generate`, and through the gateway's HTTP `/generate` (SSE) + router:
   time to first token and throughput, at `--concurrency` streams and with one stream at
   a time (where the added hop latency is not hidden by batching);
2. scale-out: aggregate throughput through gateway + router with 1, 2, ... engines;
3. `--ceiling` (issue 15, benchmarks/service_ceiling.py): the same stack with an engine that costs
   nothing (`--skip-forward`), loaded through the engine's gRPC, the router's gRPC and the
   gateway's HTTP at 64, 256 and 1,024 streams: tokens/s, requests/s and every process's CPU per
   token, i.e. how fast an engine the service path can keep up with; `--ceiling-forward` keeps the
   engine's forward pass, for the same measurement against a real engine (a GPU's, with
   `--random-shape` where the checkpoint is not at hand);
4. `--against REV` (benchmarks/side_by_side.py): one stream at a time through this checkout's
   stack and another revision's, both up at once and taking turns, for a before/after that the
   machine's drift does not decide.

Each configuration is a real `turnout serve --engines N` stack on loopback; "direct"
calls its first engine while the router sits idle. `--serve-flag` hands that command more flags,
for an A/B of a setting run by run (`--serve-flag=--dtype=bfloat16`).

    python -m benchmarks.bench_router [--model PATH] [--concurrency 64] [--output-len 64]
    python -m benchmarks.bench_router --ceiling [--ceiling-streams 64 256 1024] [--profile DIR]
    python -m benchmarks.bench_router --ceiling --ceiling-forward --random-shape 1b  # on a GPU host
    python -m benchmarks.bench_router --against REV [--tiny] [--skip-forward] [--single-output-len 8]

Prints Markdown tables (the format of docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks import service_ceiling
from benchmarks.http_stream import HttpConnection
from turnout.child_processes import free_port
from turnout.grpc_server import client_channel
from turnout.security import ClientCredentials
from turnout.v1 import common_pb2, engine_pb2, engine_pb2_grpc, inference_pb2, inference_pb2_grpc


@dataclass
class Run:
    """One batch of streams: per-stream time to first token and time per output token, tokens, the wall
    time, and the gaps between consecutive tokens of each stream (0 between tokens that arrived in one read)."""

    ttfts: list[float]
    tokens: int
    seconds: float
    gaps: list[float]
    tpots: list[float]

    @property
    def throughput(self) -> float:
        return self.tokens / self.seconds

    @property
    def median_ttft_ms(self) -> float:
        return statistics.median(self.ttfts) * 1000

    @property
    def median_itl_ms(self) -> float:
        """Median inter-token latency: what a client waits between two tokens of one stream."""
        return statistics.median(self.gaps) * 1000 if self.gaps else float("nan")

    @property
    def median_tpot_ms(self) -> float:
        """Median of the streams' paces (`Arrivals.tpot`): unlike the gaps', not 0 when tokens come in bursts."""
        paces = [t for t in self.tpots if not math.isnan(t)]
        return statistics.median(paces) * 1000 if paces else float("nan")


@dataclass
class Arrivals:
    """When each token of one stream reached the client."""

    start: float
    times: list[float]

    def add(self, tokens: int) -> None:
        now = time.perf_counter()
        self.times.extend([now] * tokens)

    @property
    def ttft(self) -> float:
        return self.times[0] - self.start if self.times else 0.0

    @property
    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:], strict=False)]

    @property
    def tpot(self) -> float:
        """Time per output token after the first (vLLM's TPOT): unlike the gaps, whose median is 0 once
        most tokens arrive several to a read (a fast engine), it is what the stream's pace was."""
        return (self.times[-1] - self.times[0]) / (len(self.times) - 1) if len(self.times) > 1 else float("nan")


class Serve:
    """`turnout serve --engines N` as a child process; from the checkout at `cwd` when given."""

    def __init__(
        self,
        model: Path | None,
        engines: int,
        policy: str,
        log: Path,
        extra: Sequence[str] = (),
        cwd: Path | None = None,
    ) -> None:
        self.port = free_port()
        # Replica i listens on engine_port + i: pick a base with room above it.
        self.engine_port = free_port()
        self.router_port = free_port()
        argv = [sys.executable, "-m", "turnout.cli", "serve", "--port", str(self.port), "--policy", policy]
        argv += ["--engines", str(engines), "--engine-port", str(self.engine_port)]
        argv += ["--router-port", str(self.router_port), *extra]
        # A token this script knows, to call the engines directly (deployments give one the same way).
        self.token = secrets.token_urlsafe(32)
        self._token_file = Path(tempfile.mkdtemp()) / "internal-token"
        self._token_file.write_text(self.token)
        self._token_file.chmod(0o600)
        argv += ["--internal-token-file", str(self._token_file)]
        if model is not None:
            argv += ["--model", str(model)]
        self.engines = engines
        self._log = log.open("ab")
        # `python -m` puts the working directory first on sys.path, and every child inherits both.
        env = dict(os.environ, PYTHONPATH=str(cwd)) if cwd is not None else None
        self.process = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, cwd=cwd, env=env
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics_page(self) -> str:
        """The stack's Prometheus page (the gateway's /metrics: every service's series)."""
        return httpx.get(f"{self.url}/metrics", timeout=30).text

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"turnout serve exited with {self.process.returncode}")
            try:
                engines = httpx.get(f"{self.url}/v1/engines", timeout=2).json()["data"]
                if sum(e["routable"] for e in engines) == self.engines:
                    return
            except (httpx.HTTPError, KeyError, json.JSONDecodeError):
                pass
            time.sleep(0.5)
        raise TimeoutError("stack not ready")

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=60)
        self._log.close()
        self._token_file.unlink(missing_ok=True)
        self._token_file.parent.rmdir()


def make_prompts(count: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(count)]


async def gather_streams(prompts: list[list[int]], one: Callable[[list[int]], Awaitable[Arrivals]]) -> Run:
    start = time.perf_counter()
    results = await asyncio.gather(*(one(p) for p in prompts))
    seconds = time.perf_counter() - start
    tokens = sum(len(r.times) for r in results)
    gaps = [g for r in results for g in r.gaps]
    return Run([r.ttft for r in results], tokens, seconds, gaps, [r.tpot for r in results])


async def direct_stream(stub: engine_pb2_grpc.EngineStub, prompt: list[int], output_len: int) -> Arrivals:
    params = common_pb2.SamplingParams(temperature=0, max_new_tokens=output_len, ignore_eos=True)
    arrivals = Arrivals(time.perf_counter(), [])
    request = engine_pb2.EngineGenerateRequest(request_id=os.urandom(8).hex(), input_ids=prompt, sampling_params=params)
    async for message in stub.Generate(request):
        tokens = 0
        for response in (message, *message.batch):  # steps ready together come in one message
            part = response.chunk if response.WhichOneof("kind") == "chunk" else response.complete
            tokens += len(part.token_ids)
        arrivals.add(tokens)
    return arrivals


async def direct(address: str, token: str, prompts: list[list[int]], output_len: int) -> Run:
    async with client_channel(address, ClientCredentials(bearer=token)) as channel:
        stub = engine_pb2_grpc.EngineStub(channel)
        return await gather_streams(prompts, lambda prompt: direct_stream(stub, prompt, output_len))


async def through_gateway(url: str, prompts: list[list[int]], output_len: int) -> Run:
    """The streams through the gateway at `url` (http://host:port), each on a bare connection of its own
    (`raw_http_stream`): an HTTP client that parses every event in Python (httpx did) spends about what
    the gateway does on the same cores, and the direct path's client (a gRPC stub) does not."""
    port = int(url.rsplit(":", 1)[1])
    return await gather_streams(
        prompts, lambda prompt: raw_http_stream(HttpConnection(port, keep_alive=False), prompt, output_len)
    )


async def sequential(run: Callable[[list[list[int]]], Awaitable[Run]], prompts: list[list[int]]) -> Run:
    runs = [await run([p]) for p in prompts]
    return Run(
        [t for r in runs for t in r.ttfts],
        sum(r.tokens for r in runs),
        sum(r.seconds for r in runs),
        [g for r in runs for g in r.gaps],
        [t for r in runs for t in r.tpots],
    )


async def router_stream(stub: inference_pb2_grpc.InferenceStub, prompt: list[int], output_len: int) -> Arrivals:
    """One stream through the router's gRPC `Generate` (as the gateway asks: steps ready together in one message)."""
    params = common_pb2.SamplingParams(temperature=0, max_new_tokens=output_len, ignore_eos=True)
    request = inference_pb2.GenerateRequest(
        input_ids=common_pb2.TokenIds(ids=prompt), sampling_params=params, accept_batches=True
    )
    arrivals = Arrivals(time.perf_counter(), [])
    async for message in stub.Generate(request):
        arrivals.add(sum(len(r.chunk.token_ids) for r in (message, *message.batch) if r.WhichOneof("kind") == "chunk"))
    return arrivals


async def raw_http_stream(connection: HttpConnection, prompt: list[int], output_len: int) -> Arrivals:
    """One `/generate` SSE stream, read as bytes (events counted, not parsed), so that the client's own
    parsing is not counted as the gateway's latency."""
    arrivals = Arrivals(time.perf_counter(), [])
    event = b"data: {"
    tail = b""  # an event's start split between two reads is counted once, in the second

    def on_body(data: bytes) -> None:
        nonlocal tail
        seen = tail + data
        arrivals.add(seen.count(event))  # one event per token with ignore_eos (no empty steps)
        tail = seen[-(len(event) - 1) :]

    await connection.exchange("/generate", service_ceiling.generate_body(prompt, output_len), on_body)
    return arrivals


def keeps_connections(args: argparse.Namespace) -> bool:
    """Whether the gateway path's HTTP connections stay open from one request to the next (--http-connections)."""
    return bool(args.http_connections == "kept")


def one_stream_at_a_time(stack: Serve, args: argparse.Namespace) -> list[str]:
    """TTFT and ITL of single streams through the engine's gRPC, the router's gRPC and the gateway's HTTP;
    each round sends one request down each path in a new random order, so drift hits the three alike."""

    async def run() -> dict[str, list[Arrivals]]:
        rng = random.Random(3000)
        measured: dict[str, list[Arrivals]] = {"engine": [], "router": [], "gateway": []}
        credentials = ClientCredentials(bearer=stack.token)
        async with (
            client_channel(f"127.0.0.1:{stack.engine_port}", credentials) as engine_channel,
            client_channel(f"127.0.0.1:{stack.router_port}", ClientCredentials()) as router_channel,
        ):
            engine = engine_pb2_grpc.EngineStub(engine_channel)
            router = inference_pb2_grpc.InferenceStub(router_channel)
            # Like the gRPC paths' channels, the HTTP connection stays open from one request to the next
            # (as `vllm bench serve` keeps its own), unless --http-connections per-request.
            http = HttpConnection(stack.port, keep_alive=keeps_connections(args))
            out = args.single_output_len
            paths: dict[str, Callable[[list[int]], Awaitable[Arrivals]]] = {
                "engine": lambda p: direct_stream(engine, p, out),
                "router": lambda p: router_stream(router, p, out),
                "gateway": lambda p: raw_http_stream(http, p, out),
            }
            for r in range(args.single_requests + 2):  # the first two rounds warm up
                order = list(paths)
                rng.shuffle(order)
                for name in order:
                    prompt = [rng.randrange(100, 40000) for _ in range(args.prompt_len)]
                    arrivals = await paths[name](prompt)
                    if r >= 2:
                        measured[name].append(arrivals)
            http.close()
        return measured

    measured = asyncio.run(run())
    ttft = {k: statistics.median(a.ttft for a in v) * 1e3 for k, v in measured.items()}
    itl = {k: statistics.median(g for a in v for g in a.gaps) * 1e3 for k, v in measured.items()}
    tpot = {k: statistics.median(a.tpot for a in v) * 1e3 for k, v in measured.items()}
    names = {"engine": "engine gRPC", "router": "router gRPC", "gateway": "gateway HTTP SSE + router"}
    return [
        f"| 1 stream at a time, {names[k]} ({args.single_requests} requests) | {ttft[k]:.1f} ms "
        f"(**{ttft[k] - ttft['engine']:+.1f}**) | {itl[k]:.2f} ms (**{itl[k] - itl['engine']:+.2f}**) "
        f"| {tpot[k]:.2f} ms (**{tpot[k] - tpot['engine']:+.2f}**) |"
        for k in measured
    ]


def overhead(args: argparse.Namespace, log: Path, extra: list[str]) -> list[str]:
    stack = Serve(args.model, 1, args.policy, log, extra)
    try:
        stack.wait_ready()
        engine = f"127.0.0.1:{stack.engine_port}"
        n, length, out = args.concurrency, args.prompt_len, args.output_len
        warm = make_prompts(8, length, seed=99)
        asyncio.run(through_gateway(stack.url, warm, 8))
        asyncio.run(direct(engine, stack.token, warm, 8))
        rows = []
        # Every run gets prompts of its own: a prompt seen before would be a prefix-cache hit.
        # The two paths take turns going first, so drift on a shared machine hits both alike.
        runs: dict[str, list[Run]] = {"direct": [], "gateway": []}
        for r in range(args.repeats):
            order = ["direct", "gateway"] if r % 2 == 0 else ["gateway", "direct"]
            for k, path in enumerate(order):
                prompts = make_prompts(n, length, seed=2 * r + k)
                if path == "direct":
                    runs[path].append(asyncio.run(direct(engine, stack.token, prompts, out)))
                else:
                    runs[path].append(asyncio.run(through_gateway(stack.url, prompts, out)))
        singles = one_stream_at_a_time(stack, args)
    finally:
        stack.stop()
    d_tp = statistics.median(r.throughput for r in runs["direct"])
    g_tp = statistics.median(r.throughput for r in runs["gateway"])
    d_ttft = statistics.median(r.median_ttft_ms for r in runs["direct"])
    g_ttft = statistics.median(r.median_ttft_ms for r in runs["gateway"])
    # Many streams at once get several tokens a read: the pace (TPOT), not the gaps, whose median is then 0.
    d_itl = statistics.median(r.median_tpot_ms for r in runs["direct"])
    g_itl = statistics.median(r.median_tpot_ms for r in runs["gateway"])
    rows.append(f"| {n} streams, direct to the engine (gRPC) | {d_tp:.1f} tok/s | {d_ttft:.0f} ms | {d_itl:.2f} ms |")
    rows.append(f"| {n} streams, gateway (HTTP SSE) + router | {g_tp:.1f} tok/s | {g_ttft:.0f} ms | {g_itl:.2f} ms |")
    rows.append(
        f"| ratio / added | **{g_tp / d_tp:.1%}** of direct throughput | **{g_ttft - d_ttft:+.1f} ms** median TTFT "
        f"| **{g_itl - d_itl:+.2f} ms** median TPOT |"
    )
    if args.repeats > 1:
        # Each round ran both paths back to back: the spread of its ratios is the noise a median hides.
        rounds = zip(runs["direct"], runs["gateway"], strict=True)
        ratios = [g.throughput / d.throughput for d, g in rounds]
        rows.append(
            f"| ratio of each round | {', '.join(f'{ratio:.1%}' for ratio in ratios)} "
            f"(spread {max(ratios) - min(ratios):.1%}) | | |"
        )
    rows.append("")
    rows.append("| one stream | median TTFT (added) | median ITL (added) | median TPOT (added) |")
    rows.append("| --- | --- | --- | --- |")
    return rows + singles


def scale_out(args: argparse.Namespace, log: Path, extra: list[str]) -> list[str]:
    rows = []
    base = 0.0
    for engines in args.scale:
        stack = Serve(args.model, engines, args.policy, log, extra)
        try:
            stack.wait_ready()
            asyncio.run(through_gateway(stack.url, make_prompts(8, args.prompt_len, seed=99), 8))
            runs = []
            for r in range(args.repeats):
                prompts = make_prompts(args.concurrency, args.prompt_len, seed=r)
                runs.append(asyncio.run(through_gateway(stack.url, prompts, args.output_len)))
        finally:
            stack.stop()
        tp = statistics.median(r.throughput for r in runs)
        base = base or tp
        ttft = statistics.median(r.median_ttft_ms for r in runs)
        rows.append(f"| {engines} | {tp:.1f} tok/s | {tp / base:.2f}x | {ttft:.0f} ms |")
    return rows


def ceiling(args: argparse.Namespace, log: Path) -> list[str]:
    """The three paths at each concurrency, on one stack (--skip-forward unless --ceiling-forward); the paths
    take turns going first."""
    model = args.model or service_ceiling.tiny_model(Path(tempfile.mkdtemp()))
    most = max(args.ceiling_streams)
    extra = [] if args.ceiling_forward else ["--skip-forward"]
    extra += ["--max-running-requests", str(most), "--max-concurrent-requests", str(most + 64)]
    extra += ["--api-server-count", str(args.api_server_count), *args.serve_flag]
    stack = Serve(model, args.ceiling_engines, args.policy, log, extra)
    try:
        stack.wait_ready()
        processes = service_ceiling.service_processes(stack.process.pid)
        targets = {
            "engine": service_ceiling.Target("engine", f"127.0.0.1:{stack.engine_port}", stack.token),
            "router": service_ceiling.Target("router", f"127.0.0.1:{stack.router_port}"),
            "router-stream": service_ceiling.Target("router-stream", f"127.0.0.1:{stack.router_port}"),
            "client": service_ceiling.Target("client", f"127.0.0.1:{stack.router_port}"),
            "gateway": service_ceiling.Target(
                "gateway", str(stack.port), api=args.ceiling_api, keep_alive=keeps_connections(args)
            ),
        }
        rows = []
        for k, streams in enumerate(args.ceiling_streams):
            order = list(args.ceiling_paths)
            order = order[k % len(order) :] + order[: k % len(order)]
            measured = {
                p: service_ceiling.measure(targets[p], processes, args, streams, seed=k, page=stack.metrics_page)
                for p in order
            }
            rows += [measured[p] for p in args.ceiling_paths]
        if args.profile is not None:
            service_ceiling.profile(targets[args.profile_path], processes, args, args.profile)
    finally:
        stack.stop()
    lines = service_ceiling.table(rows)
    if list(args.ceiling_paths) == list(service_ceiling.PATHS):
        lines.append("")
        lines.append("| streams | router gRPC / engine | gateway HTTP / engine |")
        lines.append("| --- | --- | --- |")
        for i in range(0, len(rows), 3):
            engine, router, gateway = rows[i : i + 3]
            lines.append(
                f"| {engine.streams} | {router.tokens_per_s / engine.tokens_per_s:.1%} "
                f"| {gateway.tokens_per_s / engine.tokens_per_s:.1%} |"
            )
    return lines


def main() -> None:
    from benchmarks import model_shapes  # torch: not for the client processes, which import this module

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--policy", default="cache_aware")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each configuration (the median is shown)")
    parser.add_argument("--single-requests", type=int, default=20)
    parser.add_argument("--single-output-len", type=int, default=8)
    parser.add_argument("--scale", type=int, nargs="+", default=[1, 2, 3], help="engine counts for scale-out")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--ceiling", action="store_true", help="only the service path's ceiling (--skip-forward)")
    parser.add_argument(
        "--ceiling-forward",
        action="store_true",
        help="--ceiling with the engine's forward pass: what the path leaves of a real engine (a GPU's)",
    )
    parser.add_argument("--ceiling-streams", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--ceiling-paths", nargs="+", choices=service_ceiling.ALL_PATHS, default=service_ceiling.PATHS)
    parser.add_argument("--ceiling-output-len", type=int, default=128)
    parser.add_argument(
        "--ceiling-engines",
        type=int,
        default=1,
        help="engines of the --ceiling stack (their CPU summed; the engine path loads the first one only)",
    )
    parser.add_argument(
        "--ceiling-api", choices=service_ceiling.APIS, default="generate", help="the gateway path's HTTP API"
    )
    parser.add_argument("--ceiling-requests", type=int, default=2, help="requests each stream sends in turn")
    parser.add_argument(
        "--http-connections",
        choices=("kept", "per-request"),
        default="kept",
        help="the gateway path's HTTP connections (one stream and --ceiling): kept open from one request to the "
        "next, as `vllm bench serve` keeps its own, or opened and closed for each request",
    )
    parser.add_argument("--ceiling-settle", type=float, default=3.0, help="seconds for the clients to warm up")
    parser.add_argument(
        "--api-server-count", type=int, default=1, help="gateway processes of the --ceiling stack (their CPU summed)"
    )
    parser.add_argument("--clients", type=int, default=2, help="client processes the load is split among")
    parser.add_argument("--profile", type=Path, default=None, help="py-spy the services under the gateway load")
    parser.add_argument("--profile-rate", type=int, default=50, help="py-spy's samples per second")
    parser.add_argument("--profile-seconds", type=int, default=10)
    parser.add_argument(
        "--profile-path", choices=service_ceiling.ALL_PATHS, default="gateway", help="the path whose load is profiled"
    )
    parser.add_argument("--tiny", action="store_true", help="the tests' tiny random model instead of --model")
    parser.add_argument(
        "--random-shape",
        choices=sorted(model_shapes.SHAPES),
        default=None,
        help="serve random bf16 weights of this shape (benchmarks/model_shapes.py) with --model's tokenizer "
        "(the default model's without --model): for a machine without the checkpoint",
    )
    parser.add_argument(
        "--skip-forward", action="store_true", help="the stacks' engine skips its forward pass (docs/flags.md)"
    )
    parser.add_argument(
        "--serve-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="a flag for the stacks' `turnout serve`, e.g. --serve-flag=--dtype=bfloat16 (repeatable)",
    )
    parser.add_argument(
        "--against",
        metavar="REV_OR_DIR",
        default=None,
        help="only one stream at a time, this checkout's stack and another's side by side (benchmarks/side_by_side.py)",
    )
    parser.add_argument("--against-blocks", type=int, default=10, help="rounds of --against, the stacks taking turns")
    parser.add_argument(
        "--against-block-requests", type=int, default=10, help="requests per path and stack in each --against round"
    )
    parser.add_argument(
        "--log", type=Path, default=Path(tempfile.gettempdir()) / "turnout-bench-router.log", help="the stacks' output"
    )
    args = parser.parse_args()
    if args.tiny and args.random_shape:
        parser.error("--tiny and --random-shape each choose the model: give one")
    if args.random_shape:
        from turnout.default_model import prepare_default_model

        shape = model_shapes.SHAPES[args.random_shape]
        source = args.model or prepare_default_model()
        args.model = model_shapes.write_random_checkpoint(shape, Path(tempfile.mkdtemp()), source)
    if args.ceiling:
        engine = "its forward pass" if args.ceiling_forward else "--skip-forward"
        model = args.model.name if args.model else "tiny"
        flags = "".join(f", {word}" for word in args.serve_flag)
        print(f"service path ceiling, engine with {engine}, model {model}{flags}, {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f}, {time.strftime('%Y-%m-%d %H:%M')}")  # fmt: skip
        print("\n".join(ceiling(args, args.log)), flush=True)
        print(f"(load average after: {os.getloadavg()[0]:.1f})")
        return
    if args.against is not None and min(args.against_blocks, args.against_block_requests) < 1:
        parser.error("--against-blocks and --against-block-requests must be at least 1")
    if args.tiny:
        args.model = service_ceiling.tiny_model(Path(tempfile.mkdtemp()))
    if args.model is None:
        from turnout.default_model import prepare_default_model

        args.model = prepare_default_model()
    extra = (["--skip-forward"] if args.skip_forward else []) + args.serve_flag
    when = time.strftime("%Y-%m-%d %H:%M")
    print(f"model {args.model.name}{''.join(', ' + word for word in extra)}, {os.cpu_count()} CPUs, "
          f"policy {args.policy}, {when}, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"(the stacks log to {args.log})")
    if args.against is not None:
        from benchmarks import side_by_side  # it builds on this module

        print()
        print("\n".join(side_by_side.compare(args, args.log, extra)), flush=True)
        return
    if not args.skip_overhead:
        print("\n| path | throughput | median time to first token | median time per output token |")
        print("| --- | --- | --- | --- |")
        print("\n".join(overhead(args, args.log, extra)), flush=True)
    if not args.skip_scale:
        print("\n| engines | throughput (gateway + router) | vs 1 engine | median TTFT |\n| --- | --- | --- | --- |")
        print("\n".join(scale_out(args, args.log, extra)), flush=True)


if __name__ == "__main__":
    main()
