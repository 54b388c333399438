"""The service path's ceiling (issue 15): how many tokens per second each hop can carry when the
engine costs nothing.

One `turnout serve --skip-forward` stack (services/engine/skip_forward.py: no forward pass, no
sampler, each next id is the last + 1) with the tiny random model; at each concurrency, the same
closed-loop load (every stream sends its requests back to back: token-id prompts, `ignore_eos`,
`--ceiling-output-len` new tokens) goes three ways:

- engine: the engine's gRPC `Engine.Generate` (router, tokenizer and gateway sit idle);
- router: the router's public gRPC `Inference.Generate` with `input_ids`, a call per request;
- router-stream (only when named in --ceiling-paths): the same requests carried by one
  `Inference.GenerateStream` per client process, as the gateway carries its HTTP requests
  (turnout/generate_carrier.py): what the router has ready for all of them comes as one message;
- client (only when named): the same through `turnout.client.AsyncClient`, which carries its requests
  that way, its events (`Delta`, `Completion`) made as a user's code gets them;
- gateway: the gateway's HTTP `/generate` with `input_ids`, streaming (SSE); or with `--ceiling-api`
  OpenAI's `/v1/completions` (a token-id prompt, as `vllm bench serve` sends by default) or
  `/v1/chat/completions` (one user message: its text, so the tokenizer encodes it and applies the template).
  Each stream keeps its HTTP connection from one request to the next, as `vllm bench serve` keeps its own
  (`--http-connections per-request`: a connection opened and closed for each, which costs the gateway
  more than the request itself with short outputs; benchmarks/http_stream.py).

The load comes from `--clients` processes (streams split among them) so that one Python client's
event loop is not the limit; their CPU is reported beside the services' (CPU seconds per 1,000
tokens, from /proc via psutil, every thread of the process). On a machine with few cores the
clients share them with the stack: the client's own CPU column says how much.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import statistics
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.http_stream import HttpConnection
from turnout.grpc_server import client_channel
from turnout.security import ClientCredentials
from turnout.v1 import common_pb2, engine_pb2, engine_pb2_grpc, inference_pb2, inference_pb2_grpc

SERVICES = ("engine", "tokenizer", "router", "gateway")
PATHS = ("engine", "router", "gateway")
# The paths --ceiling-paths may name; the default is PATHS.
ALL_PATHS = (*PATHS, "router-stream", "client")
# The gateway path's HTTP API (--ceiling-api): its route.
APIS = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class Target:
    """Where the load goes: a path name and what it needs to reach it."""

    path: str
    address: str  # host:port (gRPC) or the gateway's port
    token: str = ""
    api: str = "generate"  # the gateway path's (APIS)
    keep_alive: bool = True  # the gateway path's: one connection per stream, not one per request


@dataclass(frozen=True)
class ClientResult:
    tokens: int
    requests: int
    first_start: float  # time.monotonic(): one clock for every process of the machine
    last_end: float
    cpu_s: float
    ttfts: list[float]


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(100, 40000) for _ in range(length)]


async def _engine_stream(stub: Any, prompt: list[int], output_len: int) -> tuple[int, float]:
    params = common_pb2.SamplingParams(temperature=0, max_new_tokens=output_len, ignore_eos=True)
    request = engine_pb2.EngineGenerateRequest(request_id=os.urandom(8).hex(), input_ids=prompt, sampling_params=params)
    start, first, tokens = time.perf_counter(), 0.0, 0
    async for message in stub.Generate(request):
        for response in (message, *message.batch) if message.batch else (message,):
            part = response.chunk if response.WhichOneof("kind") == "chunk" else response.complete
            tokens += len(part.token_ids)
        if tokens and not first:
            first = time.perf_counter() - start
    return tokens, first


def _router_request(prompt: list[int], output_len: int) -> inference_pb2.GenerateRequest:
    params = common_pb2.SamplingParams(temperature=0, max_new_tokens=output_len, ignore_eos=True)
    # As the gateway does: what is ready comes in one message (GenerateResponse.batch).
    return inference_pb2.GenerateRequest(
        input_ids=common_pb2.TokenIds(ids=prompt), sampling_params=params, accept_batches=True
    )


async def _router_tokens(messages: AsyncIterator[inference_pb2.GenerateResponse]) -> tuple[int, float]:
    """The tokens of a router stream's messages, and the seconds to the first."""
    start, first, tokens = time.perf_counter(), 0.0, 0
    async for message in messages:
        for response in (message, *message.batch) if message.batch else (message,):
            if response.WhichOneof("kind") == "chunk":
                tokens += len(response.chunk.token_ids)
        if tokens and not first:
            first = time.perf_counter() - start
    return tokens, first


async def _router_stream(stub: Any, prompt: list[int], output_len: int) -> tuple[int, float]:
    return await _router_tokens(stub.Generate(_router_request(prompt, output_len)))


async def _carried_router_stream(carrier: Any, prompt: list[int], output_len: int) -> tuple[int, float]:
    async def messages() -> AsyncIterator[inference_pb2.GenerateResponse]:
        call = carrier.generate(_router_request(prompt, output_len), None)
        while (message := await call.read()) is not None:
            yield message

    return await _router_tokens(messages())


async def _client_library_stream(client: Any, prompt: list[int], output_len: int) -> tuple[int, float]:
    from turnout.client import Delta

    start, first, tokens = time.perf_counter(), 0.0, 0
    async for event in client.generate_stream(prompt, max_new_tokens=output_len, temperature=0.0, ignore_eos=True):
        if isinstance(event, Delta):
            tokens += len(event.token_ids)
            if tokens and not first:
                first = time.perf_counter() - start
    return tokens, first


def generate_body(prompt: list[int], output_len: int, api: str = "generate") -> bytes:
    """The JSON body of one streaming request to `APIS[api]`: `prompt`'s ids (or, for chat, a user message
    made of them), `output_len` new tokens, `ignore_eos`."""
    if api == "generate":
        params = {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True}
        request: dict[str, Any] = {"input_ids": prompt, "sampling_params": params, "stream": True}
    else:
        request = {"model": "", "max_tokens": output_len, "temperature": 0, "ignore_eos": True, "stream": True}
        request["stream_options"] = {"include_usage": True}  # the last event counts the tokens
        if api == "completions":
            request["prompt"] = prompt
        else:
            request["messages"] = [{"role": "user", "content": " ".join(f"w{t}" for t in prompt)}]
    return json.dumps(request).encode()


async def _gateway_stream(
    connection: HttpConnection, prompt: list[int], output_len: int, api: str
) -> tuple[int, float]:
    """One request through the gateway: the SSE bytes are only searched, not parsed."""
    start, first = time.perf_counter(), 0.0
    tail = b""

    def on_body(data: bytes) -> None:
        nonlocal first, tail
        if not first and b"data: {" in data:
            first = time.perf_counter() - start
        tail = (tail + data)[-(1 << 16) :]

    await connection.exchange(APIS[api], generate_body(prompt, output_len, api), on_body)
    # The last event counts the tokens: /generate's is cumulative (SGLang's shape, its meta_info), and
    # OpenAI's with include_usage is the usage.
    event = tail[tail.rindex(b"data: {") + 6 :]
    last = json.loads(event[: event.index(b"\n\n")])
    counts = last["meta_info"] if api == "generate" else last["usage"]
    return int(counts["completion_tokens"]), first


async def _client(
    target: Target, streams: int, per_stream: int, prompt_len: int, output_len: int, seed: int, go: Any
) -> ClientResult:
    rng = random.Random(seed)
    channel = carrier = library = None
    # The gateway path's: a connection per stream, kept from one of its requests to the next (or one per request).
    connections: dict[asyncio.Task[Any] | None, HttpConnection] = {}
    if target.path == "client":
        from turnout.client import AsyncClient

        library = AsyncClient(target.address)

        async def one(prompt: list[int]) -> tuple[int, float]:
            return await _client_library_stream(library, prompt, output_len)
    elif target.path == "gateway":
        port = int(target.address)

        async def one(prompt: list[int]) -> tuple[int, float]:
            task = asyncio.current_task()
            if task not in connections:
                connections[task] = HttpConnection(port, target.keep_alive)
            return await _gateway_stream(connections[task], prompt, output_len, target.api)
    else:
        bearer = ClientCredentials(bearer=target.token) if target.token else None
        channel = client_channel(target.address, bearer)
        if target.path == "engine":
            engine_stub = engine_pb2_grpc.EngineStub(channel)

            async def one(prompt: list[int]) -> tuple[int, float]:
                return await _engine_stream(engine_stub, prompt, output_len)
        elif target.path == "router-stream":
            from turnout.generate_carrier import GenerateCarrier

            carrier = GenerateCarrier(inference_pb2_grpc.InferenceStub(channel))

            async def one(prompt: list[int]) -> tuple[int, float]:
                return await _carried_router_stream(carrier, prompt, output_len)
        else:
            router_stub = inference_pb2_grpc.InferenceStub(channel)

            async def one(prompt: list[int]) -> tuple[int, float]:
                return await _router_stream(router_stub, prompt, output_len)

    await one(_prompt(rng, prompt_len))  # warm: connections open, code paths imported
    await asyncio.get_running_loop().run_in_executor(None, go.wait)
    cpu0 = time.process_time()
    ttfts: list[float] = []

    async def stream() -> int:
        total = 0
        for _ in range(per_stream):
            tokens, first = await one(_prompt(rng, prompt_len))
            total += tokens
            ttfts.append(first)
        return total

    start = time.monotonic()
    counts = await asyncio.gather(*(stream() for _ in range(streams)))
    end = time.monotonic()
    cpu = time.process_time() - cpu0
    for connection in connections.values():
        connection.close()
    if carrier is not None:
        await carrier.close()
    if library is not None:
        await library.close()
    if channel is not None:
        await channel.close()
    return ClientResult(sum(counts), streams * per_stream, start, end, cpu, ttfts)


def _client_process(
    target: Target, streams: int, per_stream: int, prompt_len: int, output_len: int, seed: int, go: Any, out: Any
) -> None:
    try:
        out.put(asyncio.run(_client(target, streams, per_stream, prompt_len, output_len, seed, go)))
    except BaseException as exc:  # the parent must not wait for a result that never comes
        out.put(RuntimeError(f"{target.path} client failed: {type(exc).__name__}: {exc}"))
        raise


@dataclass(frozen=True)
class Measured:
    path: str
    streams: int
    tokens: int
    requests: int
    seconds: float
    ttft_ms: float
    # CPU seconds per 1,000 tokens: each service, then the clients together.
    cpu_per_1k: dict[str, float]
    # Per service, from the stack's page (turnout_gc_pause_seconds) when the run read it: the seconds its
    # garbage collector held its process over its CPU seconds, and the bound of its longest pause's bucket.
    gc: dict[str, GcShare] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds


@dataclass(frozen=True)
class GcShare:
    """One service's collections during a run: their seconds over its CPU seconds, and the bucket bound of
    the longest (0.0: none)."""

    of_cpu: float
    longest_s: float


@dataclass(frozen=True)
class GcPauses:
    """turnout_gc_pause_seconds on a page: per service, the seconds summed over generations, and the count
    under each bucket bound (cumulative, over generations)."""

    seconds: dict[str, float]
    under: dict[str, dict[float, float]]

    @staticmethod
    def read(page: str) -> GcPauses:
        seconds: dict[str, float] = {}
        under: dict[str, dict[float, float]] = {}
        for family in text_string_to_metric_families(page):
            if family.name != "turnout_gc_pause_seconds":
                continue
            for sample in family.samples:
                service = sample.labels["service"]
                if sample.name.endswith("_sum"):
                    seconds[service] = seconds.get(service, 0.0) + sample.value
                elif sample.name.endswith("_bucket"):
                    bounds = under.setdefault(service, {})
                    bound = float(sample.labels["le"])
                    bounds[bound] = bounds.get(bound, 0.0) + sample.value
        return GcPauses(seconds, under)

    def since(self, before: GcPauses, cpu_s: dict[str, float]) -> dict[str, GcShare]:
        """Each service's share of `cpu_s` spent collecting since `before`, and its longest pause since (the
        smallest bound under which every new pause fell)."""
        out = {}
        for service, total in self.seconds.items():
            paused = total - before.seconds.get(service, 0.0)
            old = before.under.get(service, {})
            new = {bound: n - old.get(bound, 0.0) for bound, n in self.under.get(service, {}).items()}
            every = max(new.values(), default=0.0)
            longest = min((bound for bound, n in new.items() if n >= every), default=0.0) if every else 0.0
            out[service] = GcShare(paused / cpu_s[service] if cpu_s.get(service) else 0.0, longest)
        return out


@dataclass
class ServiceProcesses:
    """One service's processes: one, or its replicas (`--api-server-count` gateways); profiled by the first's
    pid, and its CPU is theirs together."""

    processes: list[psutil.Process]

    @property
    def pid(self) -> int:
        return self.processes[0].pid


def service_processes(serve_pid: int) -> dict[str, ServiceProcesses]:
    """The stack's service processes by name (`python -m turnout.cli NAME ...`), every process of a name
    together (several gateways, several engines), each with the helper processes it started (the
    tokenizer's chat-template render workers), so that their CPU counts as the service's."""
    found: dict[str, ServiceProcesses] = {}
    service_of: dict[int, str] = {}
    helpers: list[psutil.Process] = []
    for child in psutil.Process(serve_pid).children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        name = argv[argv.index("turnout.cli") + 1] if "turnout.cli" in argv else ""
        if name in SERVICES:
            found.setdefault(name, ServiceProcesses([])).processes.append(child)
            service_of[child.pid] = name
        else:
            helpers.append(child)
    for helper in helpers:  # after every service's own process, which stays first (the one profiled)
        with contextlib.suppress(psutil.Error):
            owner = next((service_of[p.pid] for p in helper.parents() if p.pid in service_of), None)
            if owner is not None:
                found[owner].processes.append(helper)
    return found


def cpu_seconds(service: ServiceProcesses) -> float:
    """User and system CPU seconds of every thread of the service's processes so far."""
    return sum(times.user + times.system for times in (p.cpu_times() for p in service.processes))


def measure(
    target: Target,
    processes: dict[str, ServiceProcesses],
    args: argparse.Namespace,
    streams: int,
    seed: int,
    requests_per_stream: int | None = None,
    page: Callable[[], str] | None = None,
) -> Measured:
    """`page`: reads the stack's metrics page, for the services' collector pauses during the run."""
    clients = max(1, min(args.clients, streams))
    context = multiprocessing.get_context("spawn")
    go, out = context.Event(), context.Queue()
    shares = [streams // clients + (i < streams % clients) for i in range(clients)]
    workers = [
        context.Process(
            target=_client_process,
            args=(
                target,
                share,
                requests_per_stream or args.ceiling_requests,
                args.prompt_len,
                args.ceiling_output_len,
                seed * 100 + i,
                go,
                out,
            ),
        )
        for i, share in enumerate(shares)
    ]
    for worker in workers:
        worker.start()
    time.sleep(args.ceiling_settle)  # every client connected and warmed before the clock starts
    gc_before = GcPauses.read(page()) if page is not None else None
    before = {name: cpu_seconds(p) for name, p in processes.items()}
    go.set()
    results: list[ClientResult] = [out.get(timeout=1800) for _ in workers]
    for worker in workers:
        worker.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    after = {name: cpu_seconds(p) for name, p in processes.items()}
    collector: dict[str, GcShare] = {}
    if page is not None and gc_before is not None:  # (both or neither: the second for the type checker)
        collector = GcPauses.read(page()).since(gc_before, {name: after[name] - before[name] for name in processes})
    tokens = sum(r.tokens for r in results)
    seconds = max(r.last_end for r in results) - min(r.first_start for r in results)
    cpu = {name: (after[name] - before[name]) / tokens * 1000 for name in processes}
    cpu["client"] = sum(r.cpu_s for r in results) / tokens * 1000
    ttft = statistics.median(t for r in results for t in r.ttfts) * 1000
    return Measured(target.path, streams, tokens, sum(r.requests for r in results), seconds, ttft, cpu, collector)


def _pause(seconds: float) -> str:
    return "none" if not seconds else f"≤ {seconds * 1e3:g} ms"


def table(rows: list[Measured]) -> list[str]:
    names = [*SERVICES, "client"]
    lines = [
        "| streams | path | tokens/s | requests/s | median TTFT | CPU s / 1k tokens: " + " | ".join(names) + " |",
        "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in names) + " |",
    ]
    for m in rows:
        cpu = " | ".join(f"{m.cpu_per_1k.get(n, 0.0):.3f}" for n in names)
        lines.append(
            f"| {m.streams} | {m.path} | {m.tokens_per_s:,.0f} | {m.requests_per_s:.1f} | {m.ttft_ms:.0f} ms | {cpu} |"
        )
    measured_gc = [m for m in rows if m.gc]
    if measured_gc:
        lines += [
            "",
            "| streams | path | collector's share of the CPU: "
            + " | ".join(SERVICES)
            + " | longest pause: "
            + " | ".join(SERVICES)
            + " |",
            "| --- | --- | " + " | ".join("---" for _ in range(2 * len(SERVICES))) + " |",
        ]
        for m in measured_gc:
            none = GcShare(0.0, 0.0)
            shares = " | ".join(f"{m.gc.get(n, none).of_cpu:.1%}" for n in SERVICES)
            longest = " | ".join(_pause(m.gc.get(n, none).longest_s) for n in SERVICES)
            lines.append(f"| {m.streams} | {m.path} | {shares} | {longest} |")
    return lines


def tiny_model(root: Path) -> Path:
    """The tests' 2-layer random Llama with the default model's tokenizer (tests/models.py)."""
    from tests.models import build_tiny_llama
    from turnout.default_model import prepare_default_model

    return build_tiny_llama(root / "tiny-llama", prepare_default_model())


def profile(target: Target, processes: dict[str, ServiceProcesses], args: argparse.Namespace, out: Path) -> None:
    """py-spy every service in turn (--profile-seconds each) while `target` carries the largest load but
    one; print each one's top frames (own time, and time with callees) from the collapsed stacks it
    writes to `out`."""
    import subprocess
    import threading

    from benchmarks.py_spy import py_spy

    spy = str(py_spy())
    out.mkdir(parents=True, exist_ok=True)
    streams = sorted(args.ceiling_streams)[-2] if len(args.ceiling_streams) > 1 else args.ceiling_streams[0]
    done: list[Measured] = []
    # Long enough to outlast the profile and py-spy's start (seconds on a process with torch loaded).
    per_stream = max(
        args.ceiling_requests, 10_000 * len(processes) * args.profile_seconds // (streams * args.ceiling_output_len)
    )
    load = threading.Thread(
        target=lambda: done.append(measure(target, processes, args, streams, seed=77, requests_per_stream=per_stream))
    )
    load.start()
    # Start once the load runs (the target service spends a tenth of a core); its end is waited for.
    busiest = processes.get(target.path, processes["engine"])
    before = cpu_seconds(busiest)
    while load.is_alive():
        time.sleep(1)
        now = cpu_seconds(busiest)
        if now - before > 0.1:
            break
        before = now
    for name, process in processes.items():  # one after the other, on the same load
        command = [
            spy,
            "record",
            "--nonblocking",
            "-r",
            str(args.profile_rate),
            "-d",
            str(args.profile_seconds),
            "-f",
            "raw",
        ]
        command += ["-o", str(out / f"{name}.txt"), "-p", str(process.pid)]
        with open(out / f"{name}.log", "w") as spy_log:
            subprocess.run(command, stdout=spy_log, stderr=subprocess.STDOUT, check=False)
    load.join()
    print(f"\nprofiles ({target.path} path, {streams} streams, {done[0].tokens_per_s:,.0f} tok/s), in {out}:")
    for name in processes:
        path = out / f"{name}.txt"
        if path.is_file():
            print(f"\n{name}:\n" + "\n".join(top_frames(path.read_text())))


def top_frames(collapsed: str, count: int = 8) -> list[str]:
    """The frames holding most samples: by own time (the stack's leaf) and by time with callees."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in collapsed.splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack or not samples.isdigit():
            continue
        n = int(samples)
        total += n
        frames = stack.split(";")
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + n
    if not total:
        return ["(no samples)"]
    lines = [f"- own: {n / total:.0%} {frame}" for frame, n in sorted(own.items(), key=lambda kv: -kv[1])[:count]]
    # Our own frames (and grpc's), without the entry points every sample passes through.
    ours = ("services/", "gateway/", "turnout/errors", "grpc/", "starlette/", "uvicorn/protocols")
    entry = ("run (services", "main (turnout", "serve (turnout", "Server.run", "run (turnout")
    busy = [
        (f, n)
        for f, n in sorted(inclusive.items(), key=lambda kv: -kv[1])
        if any(o in f for o in ours) and not f.startswith(entry)
    ]
    lines += [f"- with callees: {n / total:.0%} {frame}" for frame, n in busy[:count]]
    return lines
