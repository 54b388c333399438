"""Starting the real four-service stack through `turnout serve`, as a user would."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.credentials import ADMIN
from turnout.child_processes import LAUNCHER_PID_ENV, free_port
from turnout.grpc_auth import sync_channel
from turnout.v1 import engine_pb2, engine_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
READY_LINE = b"Turnout is serving "


@dataclass
class Stack:
    process: subprocess.Popen[bytes]
    port: int
    engine_port: int
    tokenizer_port: int
    router_port: int
    log_path: Path
    # The CA of a stack serving HTTPS (--ssl-certfile); None: plain HTTP.
    https_ca: Path | None = None

    @property
    def base_url(self) -> str:
        return f"{'https' if self.https_ca else 'http'}://127.0.0.1:{self.port}"

    @property
    def ports(self) -> list[int]:
        return [self.port, self.engine_port, self.tokenizer_port, self.router_port]

    def engine_load(self) -> engine_pb2.Load:
        with sync_channel(f"127.0.0.1:{self.engine_port}", ADMIN, []) as channel:
            return engine_pb2_grpc.EngineStub(channel).GetLoad(engine_pb2.GetLoadRequest(), timeout=5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def child_pids(self) -> list[int]:
        """The launcher's children (its services) now."""
        pid = self.process.pid
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    def stop(self, timeout_s: float = 20.0, *, ctrl_c: bool = False) -> float:
        """SIGTERM the launcher (or SIGINT its whole process group, as a terminal's
        Ctrl-C does); return how long it took to exit."""
        started = time.monotonic()
        if self.process.poll() is None:
            if ctrl_c:
                os.killpg(self.process.pid, signal.SIGINT)
            else:
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                raise
        return time.monotonic() - started


def start_stack(
    model: Path, log_path: Path, *extra: str, timeout_s: float = 240.0, https_ca: Path | None = None
) -> Stack:
    ports = [free_port() for _ in range(4)]
    argv = [sys.executable, "-m", "turnout.cli", "serve", "--model", str(model), "--port", str(ports[0])]
    argv += ["--engine-port", str(ports[1]), "--tokenizer-port", str(ports[2]), "--router-port", str(ports[3])]
    argv += list(extra)
    log_file = log_path.open("wb")
    # Its own session and process group, like a command started from a terminal; it stops when this
    # test process dies, killed or not (as the launcher's own children stop with it), so a killed test
    # run leaves no stack behind.
    env = {**os.environ, LAUNCHER_PID_ENV: str(os.getpid())}
    process = subprocess.Popen(
        argv, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    port, engine_port, tokenizer_port, router_port = ports
    stack = Stack(process, port, engine_port, tokenizer_port, router_port, log_path, https_ca)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"turnout serve exited with {process.returncode}:\n{stack.log()}")
        try:
            # The launcher's ready line comes after its own health checks of every child: a
            # healthy gateway alone may answer before the launcher has said where things are.
            verify = ssl.create_default_context(cafile=https_ca) if https_ca else True
            healthy = httpx.get(f"{stack.base_url}/health", timeout=1.0, verify=verify).status_code == 200
            if healthy and READY_LINE in log_path.read_bytes():
                return stack
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    stack.stop()
    raise TimeoutError(f"stack not healthy after {timeout_s}s:\n{stack.log()}")


def port_in_use(port: int) -> bool:
    """Whether something still listens on the port. SO_REUSEADDR, as a restarted server
    would use, so closed connections lingering in TIME_WAIT do not count."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False
