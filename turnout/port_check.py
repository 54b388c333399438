"""The ports `turnout serve` will bind, checked before anything is loaded.

A busy port found only when the gateway binds it costs the whole start (a model load of a minute)
and, worse, another server's answer to the launcher's health probe looked like ours. So every
fixed port is tried first, and each one that is taken (or given twice) is one readable line
naming the port, the flag that chose it and, where this user may see it, the process holding it.

Binding succeeds now and may still fail later if something takes the port in between: the
launcher's ready line also checks that the gateway's port belongs to the gateway.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass


@dataclass(frozen=True)
class PlannedPort:
    """A port a child will listen on: `host:port`, chosen by `flag` (for the messages)."""

    host: str
    port: int
    flag: str


def port_problems(planned: list[PlannedPort]) -> list[str]:
    """One line per port that cannot be bound: taken by another process, or given twice."""
    problems: list[str] = []
    seen: dict[int, PlannedPort] = {}
    for want in planned:
        if want.port in seen:
            problems.append(f"port {want.port} is given twice ({seen[want.port].flag} and {want.flag})")
            continue
        seen[want.port] = want
        if not _can_bind(want.host, want.port):
            problems.append(f"port {want.port} is already in use ({want.flag}){_held_by(want.port)}")
    return problems


def _can_bind(host: str, port: int) -> bool:
    """Whether a server could listen on host:port now. SO_REUSEADDR, as servers bind, so closed
    connections lingering in TIME_WAIT do not count; no SO_REUSEPORT (gRPC's default), which would
    share the port with a listener already there."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return True  # an unknown host is the server's own error to report
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError:
            return False
    return True


def listening_pid(port: int) -> int | None:
    """The process listening on TCP `port`, when this user may see it (else None)."""
    import psutil

    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    return None


def _held_by(port: int) -> str:
    import psutil

    pid = listening_pid(port)
    if pid is None:
        return ""
    try:
        command = " ".join(psutil.Process(pid).cmdline())[:120]
    except psutil.Error:
        return f", held by pid {pid}"
    return f", held by pid {pid}: {command}"
