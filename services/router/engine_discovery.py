"""Which engines exist: the `--engine` targets (and RouterAdmin additions), resolved into addresses.

A target is HOST:PORT. An IP address stands for itself. A DNS name stands for
every address it resolves to, resolved again every `refresh_interval_s`: a
Kubernetes headless Service or docker-compose's `--scale engine=N` answers one
name with one address per replica, and replicas that appear or disappear are
added to or removed from the pool without a restart. A failed lookup keeps the
addresses from the last one (DNS hiccups must not empty the pool).

IPv4 answers are used when there are any, else IPv6: `localhost` should mean
one engine, not the same engine twice.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable

from services.router.background import BackgroundLoop
from services.router.config import check_address
from services.router.engine_pool import EnginePool
from turnout.errors import InvalidArgument, NotFound

log = logging.getLogger(__name__)

# (host, port) -> "IP:PORT" addresses; raises OSError when the name does not resolve.
Resolver = Callable[[str, int], Awaitable[list[str]]]


def _join(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


async def resolve_dns(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    v4 = sorted({str(info[4][0]) for info in infos if info[0] == socket.AF_INET})
    v6 = sorted({str(info[4][0]) for info in infos if info[0] == socket.AF_INET6})
    return [_join(ip, port) for ip in (v4 or v6)]


def split_target(target: str) -> tuple[str, int, bool]:
    """(host, port, is_ip) of HOST:PORT; `[v6]:port` is accepted."""
    check_address(target, "engine address")
    host, _, port = target.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        return host, int(port), False
    return bare, int(port), True


class EngineDiscovery(BackgroundLoop):
    def __init__(self, pool: EnginePool, refresh_interval_s: float, resolver: Resolver = resolve_dns) -> None:
        self._pool = pool
        self._interval = refresh_interval_s
        self._resolve = resolver
        # target -> the addresses it stands for right now.
        self._targets: dict[str, set[str]] = {}

    @property
    def targets(self) -> list[str]:
        return list(self._targets)

    async def add(self, target: str) -> bool:
        """Start routing to `target`; False when it is already known."""
        try:
            split_target(target)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from None
        if target in self._targets:
            return False
        self._targets[target] = set()
        await self._refresh(target)
        return True

    async def remove(self, target: str) -> None:
        addresses = self._targets.pop(target, None)
        if addresses is None:
            known = ", ".join(self._targets) or "none"
            raise NotFound(f"no engine was added as {target!r}; known: {known}")
        for address in addresses - self._claimed():
            await self._pool.remove(address)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            for target in list(self._targets):
                if not split_target(target)[2]:
                    await self._refresh(target)

    async def _refresh(self, target: str) -> None:
        host, port, is_ip = split_target(target)
        if is_ip:
            found = {_join(host, port)}
        else:
            try:
                found = set(await self._resolve(host, port))
            except OSError as exc:
                log.warning("engine name does not resolve", extra={"target": target, "error": str(exc)})
                return
        if target not in self._targets:  # removed while we were resolving
            return
        before = self._targets[target]
        self._targets[target] = found
        for address in sorted(found - before):
            self._pool.add(address, target)
        for address in sorted((before - found) - self._claimed()):
            await self._pool.remove(address)
        if found != before and not is_ip:
            log.info("engine name resolved", extra={"target": target, "addresses": sorted(found)})

    def _claimed(self) -> set[str]:
        return set().union(*self._targets.values()) if self._targets else set()
