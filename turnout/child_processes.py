"""The child processes of `turnout serve`: start in stages, each waited for until healthy; stop
in reverse, SIGTERM then SIGKILL after a grace period; and the children's side of dying with the
launcher. Restarting the ones that die is `supervisor.py`'s job.

A child's stderr passes through the launcher (child_output.py), so a child that dies during
start-up is explained by its own last lines; `TURNOUT_TTY` tells it whether those reach a
terminal. A health answer counts only from the child itself: when another process holds the
child's port, the start fails instead of reporting someone else's server as ours.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from turnout.child_output import OutputTail, last_error_lines
from turnout.cpu_cores import bind_process
from turnout.grpc_auth import sync_channel
from turnout.logs import TTY_ENV, stderr_is_terminal
from turnout.port_check import listening_pid
from turnout.security import ClientCredentials

log = logging.getLogger(__name__)

STOP_GRACE_S = 8.0
_PR_SET_PDEATHSIG = 1


# Every port `free_port` handed out in this process, with the lock that guards the set.
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, and one this process never handed out before: the kernel may
    give the port of a socket just closed to the next bind, so two calls in a row (the launcher's
    engine and tokenizer ports) could otherwise return the same port."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        with _handed_out_lock:
            if port not in _handed_out:
                _handed_out.add(port)
                return port


# In each child's environment: the launcher's pid, for `die_with_launcher`.
LAUNCHER_PID_ENV = "TURNOUT_LAUNCHER_PID"


def die_with_launcher() -> None:
    """In a child the launcher started (first thing its `turnout` command does): get SIGTERM when
    the launcher dies (Linux). Done here rather than in a preexec_fn: that runs Python between fork
    and exec, which can deadlock once the launcher has threads (gRPC's, from its health checks)."""
    pid = os.environ.pop(LAUNCHER_PID_ENV, None)
    if pid is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(pid):  # the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def grpc_healthy(address: str, credentials: ClientCredentials | None = None) -> bool:
    """The standard health service at `address` says SERVING (open to all: `credentials` only for TLS)."""
    with sync_channel(address, credentials, []) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def http_healthy(url: str, ca_certs: str | None = None) -> bool:
    """GET `url` answers 200 (an https URL is verified with `ca_certs`, else the system roots)."""
    context = ssl.create_default_context(cafile=ca_certs) if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(url, timeout=1.0, context=context) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Child:
    name: str
    argv: list[str]
    healthy: Callable[[], bool]
    # Children of one stage start together; each stage waits for the previous one to be healthy.
    stage: int = 0
    env: dict[str, str] | None = None
    # Its Prometheus port (--metrics), else None.
    metrics_port: int | None = None
    # The port its health is probed on: a health answer counts only while the child holds it.
    port: int | None = None
    # File descriptors it inherits (the gateways' shared socket).
    pass_fds: tuple[int, ...] = ()
    # The CPUs it runs on (`turnout serve --cpu-reserved-cores`); empty: wherever the kernel puts it.
    cpus: tuple[int, ...] = ()
    process: subprocess.Popen[bytes] | None = None
    output: OutputTail | None = None

    def start(self) -> None:
        log.info("starting", extra={"child": self.name, "argv": self.argv, "env": self.env or {}})
        tty = "1" if stderr_is_terminal() else "0"
        env = {**os.environ, **(self.env or {}), LAUNCHER_PID_ENV: str(os.getpid()), TTY_ENV: tty}
        self.process = subprocess.Popen(self.argv, env=env, stderr=subprocess.PIPE, pass_fds=self.pass_fds)
        if self.cpus:  # its threads so far: the interpreter it exec'd has hardly started
            bind_process(self.process.pid, self.cpus)
        assert self.process.stderr is not None
        self.output = OutputTail(self.process.stderr, self.name)

    @property
    def exited(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def port_holder(self) -> int | None:
        """The pid holding this child's port when it is not this child (None: the child, or unknown)."""
        if self.port is None or self.process is None:
            return None
        pid = listening_pid(self.port)
        return None if pid in (None, self.process.pid) else pid


class Stack:
    def __init__(self, children: list[Child], on_stopped: Callable[[], None] | None = None) -> None:
        self.children = children
        self.stopping = False
        # Runs once every child has stopped: what the children shared goes then.
        self._on_stopped = on_stopped

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def start(self, timeout_s: float) -> bool:
        """Start children in order, each healthy before the next; False if stopped or one failed."""
        deadline = time.monotonic() + timeout_s
        for stage in sorted({c.stage for c in self.children}):
            group = [c for c in self.children if c.stage == stage]
            for child in group:
                child.start()
            pending = list(group)
            while pending:
                if self.stopping:
                    return False
                dead = self._dead_child()
                if dead is not None:
                    self._explain_death(dead)
                    return False
                if time.monotonic() > deadline:
                    log.error("startup timed out", extra={"waiting_for": [c.name for c in pending]})
                    return False
                healthy = [c for c in pending if c.healthy()]
                for child in healthy:
                    holder = child.port_holder()
                    if holder is not None:
                        _say(
                            f"port {child.port} answered {child.name}'s health probe, but pid {holder} holds it, "
                            f"not the {child.name} (pid {child.process.pid if child.process else '?'})"
                        )
                        return False
                pending = [c for c in pending if c not in healthy]
                if pending:
                    time.sleep(0.25)
        return True

    def _explain_death(self, child: Child) -> None:
        """Say which child died during start-up, and its last lines that tell why."""
        assert child.process is not None
        if child.output is not None:
            child.output.join(timeout_s=2.0)  # its last lines may still be in the pipe
        lines = last_error_lines(list(child.output.lines) if child.output else [])
        code = child.process.returncode
        how = f"exit code {code}" if code >= 0 else f"signal {-code}"
        _say(f"the {child.name} exited during start-up ({how})" + ("; its last lines:" if lines else ""))
        for line in lines:
            print("    " + line.replace("\n", "\n    "), file=sys.stderr, flush=True)

    def stop(self) -> None:
        running = [c for c in reversed(self.children) if c.process is not None and c.exited is None]
        for child in running:
            assert child.process is not None
            child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for child in running:
            assert child.process is not None
            try:
                child.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning("killing child that ignored SIGTERM", extra={"child": child.name})
                child.process.kill()
                child.process.wait()
            log.info("child stopped", extra={"child": child.name, "returncode": child.process.returncode})
            if child.output is not None:
                child.output.join(timeout_s=1.0)  # its last lines reach our stderr before we exit
        if self._on_stopped is not None:
            self._on_stopped()
            self._on_stopped = None

    def _dead_child(self) -> Child | None:
        return next((c for c in self.children if c.exited is not None), None)


def _say(problem: str) -> None:
    """One line for the person who ran `turnout serve`, whatever the log format."""
    print(f"turnout serve: {problem}", file=sys.stderr, flush=True)
