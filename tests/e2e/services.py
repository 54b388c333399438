"""Starting single services (`turnout engine`, `tokenizer`, `router`) as processes, for tests that
need to kill and restart one of them, which `turnout serve` (one stack, stopped as a whole) cannot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.stack import ROOT
from turnout.child_processes import LAUNCHER_PID_ENV, free_port, grpc_healthy


@dataclass
class Service:
    name: str
    args: list[str]
    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> Service:
        argv = [sys.executable, "-m", "turnout.cli", *self.args, "--host", "127.0.0.1", "--port", str(self.port)]
        with self.log_path.open("ab") as log:
            # It stops when this test process dies (killed or not), as the launcher's children do.
            env = {**os.environ, LAUNCHER_PID_ENV: str(os.getpid())}
            self.process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        return self

    def wait_healthy(self, timeout_s: float = 120.0) -> Service:
        deadline = time.monotonic() + timeout_s
        while not grpc_healthy(self.address):
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not healthy after {timeout_s}s:\n{self.log()}")
            time.sleep(0.2)
        return self

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, open streams break."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def terminate(self) -> None:
        """SIGTERM without waiting (stop several at once, then `stop` each)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]
