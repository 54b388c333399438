"""The client side of `bench_peers`: one workload against one running server.

The real run drives every server with vLLM's own `vllm bench serve` from the peers' venv, so no
server is measured by a client its authors wrote. `builtin_client` is a small stand-in with the
same metrics for the smoke test, used only where that venv is not installed.

Token counts are checked, never assumed: `vllm bench serve` takes `completion_tokens` only from a
usage chunk without choices. Turnout and vLLM send one; llama-server puts its usage on the chunk
with the last choice, so the client would re-tokenize the text instead. For llama-server the
count comes from its own log (one `eval time = ... / N tokens` line per request).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks import peer_installs
from benchmarks.peer_servers import SERVED_NAME, Server


@dataclass(frozen=True)
class Workload:
    """One `vllm bench serve` run: `prefix_len` > 0 means requests share prompt prefixes."""

    name: str
    concurrency: int
    num_prompts: int
    input_len: int = 128
    output_len: int = 128
    prefix_len: int = 0
    num_prefixes: int = 0

    def bench_args(self) -> list[str]:
        if self.prefix_len:
            return [
                "--dataset-name",
                "prefix_repetition",
                "--prefix-repetition-prefix-len",
                str(self.prefix_len),
                "--prefix-repetition-suffix-len",
                str(self.input_len),
                "--prefix-repetition-num-prefixes",
                str(self.num_prefixes),
                "--prefix-repetition-output-len",
                str(self.output_len),
            ]
        random_lengths = ["--random-input-len", str(self.input_len), "--random-output-len", str(self.output_len)]
        return ["--dataset-name", "random", *random_lengths]


@dataclass(frozen=True)
class Result:
    output_tokens: int
    expected_tokens: int
    seconds: float
    median_ttft_ms: float
    median_tpot_ms: float
    completed: int

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def tokens_ok(self) -> bool:
        return self.output_tokens == self.expected_tokens


def _llama_log_tokens(log: Path, offset: int) -> int:
    """Output tokens llama-server reports for the requests logged after byte `offset`."""
    text = log.read_bytes()[offset:].decode(errors="replace")
    return sum(int(n) for n in re.findall(r"(?<!prompt) eval time =\s*[\d.]+ ms /\s*(\d+) tokens", text))


def vllm_bench(server: Server, workload: Workload, tokenizer: Path, warmups: int = 2) -> Result:
    """`vllm bench serve` against `server`; its JSON result, with token counts verified."""
    assert server.log_path is not None
    log_offset = server.log_path.stat().st_size
    with tempfile.TemporaryDirectory() as tmp:
        argv = [str(peer_installs.vllm_cli()), "bench", "serve", "--backend", "openai"]
        argv += ["--base-url", server.url, "--endpoint", "/v1/completions", "--model", SERVED_NAME]
        argv += ["--tokenizer", str(tokenizer), *workload.bench_args(), "--ignore-eos", "--temperature", "0"]
        argv += ["--num-prompts", str(workload.num_prompts), "--max-concurrency", str(workload.concurrency)]
        argv += ["--num-warmups", str(warmups), "--percentile-metrics", "ttft,tpot", "--disable-tqdm"]
        argv += ["--save-result", "--save-detailed", "--result-dir", tmp, "--result-filename", "result.json"]
        argv += ["--seed", "0"]
        if server.name == "llama.cpp":
            argv += ["--header", "Connection=close"]  # llama-server closes kept-alive connections
        subprocess.run(argv, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=3600)
        data = json.loads((Path(tmp) / "result.json").read_text())
    tokens = int(data["total_output_tokens"])
    median_tpot_ms = float(data["median_tpot_ms"])
    if server.name == "llama.cpp":
        # The warm-ups are logged too: they ran before the measured requests, with the same lengths.
        tokens = _llama_log_tokens(server.log_path, log_offset) - warmups * workload.output_len
        # The client's TPOT divides by its re-tokenized count; with every request's count checked
        # above (ignore_eos: all equal), divide by the real one instead.
        if tokens == workload.num_prompts * workload.output_len:
            decode_s = [e2e - ttft for e2e, ttft in zip(data["latencies"], data["ttfts"], strict=True)]
            median_tpot_ms = 1000 * statistics.median(decode_s) / (workload.output_len - 1)
    return Result(
        output_tokens=tokens,
        expected_tokens=workload.num_prompts * workload.output_len,
        seconds=float(data["duration"]),
        median_ttft_ms=float(data["median_ttft_ms"]),
        median_tpot_ms=median_tpot_ms,
        completed=int(data["completed"]),
    )


async def _one_stream(
    client: httpx.AsyncClient, url: str, prompt: list[int], output_len: int
) -> tuple[float, float, int]:
    """(time to first token, seconds, completion tokens from the usage chunk) of one request."""
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": output_len, "temperature": 0, "ignore_eos": True}
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft, tokens = 0.0, 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if chunk.get("choices") and not ttft:
                ttft = time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return ttft, time.perf_counter() - start, tokens


def builtin_client(server: Server, workload: Workload, vocab: int = 40000) -> Result:
    """The same metrics as `vllm bench serve` from random token-id prompts (smoke test only)."""
    rng = random.Random(0)
    prompts = [[rng.randrange(100, vocab) for _ in range(workload.input_len)] for _ in range(workload.num_prompts)]

    async def run() -> tuple[list[tuple[float, float, int]], float]:
        gate = asyncio.Semaphore(workload.concurrency)
        async with httpx.AsyncClient(timeout=600) as client:

            async def one(prompt: list[int]) -> tuple[float, float, int]:
                async with gate:
                    return await _one_stream(client, server.url, prompt, workload.output_len)

            start = time.perf_counter()
            results = await asyncio.gather(*(one(p) for p in prompts))
            return list(results), time.perf_counter() - start

    results, seconds = asyncio.run(run())
    tpots = [(total - ttft) / (n - 1) for ttft, total, n in results if n > 1]
    return Result(
        output_tokens=sum(n for _, _, n in results),
        expected_tokens=workload.num_prompts * workload.output_len,
        seconds=seconds,
        median_ttft_ms=1000 * statistics.median(r[0] for r in results),
        median_tpot_ms=1000 * statistics.median(tpots) if tpots else 0.0,
        completed=len(results),
    )
