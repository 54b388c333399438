"""The servers `bench_peers` compares, each started alone on loopback and stopped after its workloads.

Every server serves the same Hugging Face folder (llama.cpp: the same weights as GGUF) under one
name, `SERVED_NAME`, so the client's arguments are the same for all of them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks import peer_installs
from turnout.child_processes import free_port

SERVED_NAME = "bench-model"
SERVERS = ("turnout", "vllm", "llama.cpp")
PRECISIONS = ("float32", "bfloat16")
# What the issue measured vLLM with: two cores bound, 2 GiB of KV cache, no hub look-ups.
VLLM_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "HF_HUB_OFFLINE": "1",
}
# Prompt + output tokens of the longest request any workload sends, and the most concurrent ones.
MAX_MODEL_LEN = 1024
MAX_CONCURRENCY = 64


@dataclass
class Server:
    """One server process: `argv` is complete but for the port, which `start` appends."""

    name: str
    precision: str
    argv: list[str]
    port_flag: str
    env: dict[str, str] = field(default_factory=dict)
    # vLLM compiles for minutes on its first start (cached after).
    startup_timeout_s: float = 1800.0
    process: subprocess.Popen[bytes] | None = None
    port: int = 0
    log_path: Path | None = None

    @property
    def label(self) -> str:
        return f"{self.name} {self.precision}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, log_dir: Path) -> None:
        self.port = free_port()
        self.log_path = log_dir / f"{self.name}-{self.precision}.log"
        log = self.log_path.open("ab")
        argv = [*self.argv, self.port_flag, str(self.port)]
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        env = {**os.environ, **self.env}
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.label} exited with {self.process.returncode}; see {self.log_path}")
            try:
                # /health answers 200 only once the model is loaded, on all three servers.
                healthy = httpx.get(f"{self.url}/health", timeout=5).status_code == 200
                if healthy and httpx.get(f"{self.url}/v1/models", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"{self.label} not healthy after {self.startup_timeout_s:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)


def turnout_server(model: Path, precision: str) -> Server:
    argv = [sys.executable, "-m", "turnout.cli", "serve", "--model", str(model), "--dtype", precision]
    argv += ["--served-model-name", SERVED_NAME, "--host", "127.0.0.1"]
    return Server("turnout", precision, argv, "--port", startup_timeout_s=600.0)


def vllm_server(model: Path, precision: str) -> Server:
    argv = [str(peer_installs.vllm_cli()), "serve", str(model), "--served-model-name", SERVED_NAME]
    argv += ["--dtype", precision, "--host", "127.0.0.1", "--max-model-len", str(MAX_MODEL_LEN)]
    argv += ["--max-num-seqs", str(MAX_CONCURRENCY)]
    return Server("vllm", precision, argv, "--port", env=VLLM_ENV)


def llama_server(model: Path, precision: str, threads: int | None = None) -> Server:
    """`threads` defaults to every core; on a busy machine its threads spin waiting on each other,
    and 1 thread is the only way to get a smoke pass through in reasonable time."""
    gguf = peer_installs.gguf_path(model, precision)
    # One slot per concurrent request, each with room for the longest request (`-c` is split over slots).
    argv = [str(peer_installs.llama_server_path()), "-m", str(gguf), "--alias", SERVED_NAME, "--host", "127.0.0.1"]
    argv += ["-t", str(threads or os.cpu_count() or 1)]
    argv += ["-np", str(MAX_CONCURRENCY), "-c", str(MAX_CONCURRENCY * MAX_MODEL_LEN)]
    return Server("llama.cpp", precision, argv, "--port", startup_timeout_s=600.0)


def prepare(server: str, model: Path, precision: str, llama_threads: int | None = None) -> Server:
    """Install what `server` needs (skipped when cached) and describe it; starts nothing."""
    if server == "turnout":
        return turnout_server(model, precision)
    if server == "vllm":
        peer_installs.install_vllm()
        return vllm_server(model, precision)
    if server == "llama.cpp":
        peer_installs.build_llama_server()
        peer_installs.convert_gguf(model, precision)
        return llama_server(model, precision, llama_threads)
    raise ValueError(f"unknown server {server!r}; choose from {', '.join(SERVERS)}")
