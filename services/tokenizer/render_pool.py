"""A small pool of render worker processes (render_worker.py) that the tokenizer owns.

Each render goes to an idle worker and must answer within `timeout_s`. A worker
that does not (too slow, or its caller went away mid-render) is killed and a
fresh one started in its place, so a hostile template costs at most one worker
for `timeout_s` and never touches the event loop. Requests wait for an idle
worker in arrival order.

Invariant: a worker is in `_idle` only when it has no request in flight, so its
next frame always answers the next request sent to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from services.tokenizer.render_worker import encode_frame
from turnout.errors import InvalidArgument

log = logging.getLogger(__name__)

_HEADER_BYTES = 8
# The folder holding the `services` package, so the worker imports this very code.
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        assert process.stdin is not None and process.stdout is not None
        self._stdin = process.stdin
        self._stdout = process.stdout

    async def call(self, value: Any) -> Any:
        self._stdin.write(encode_frame(value))
        await self._stdin.drain()
        return await self.read()

    async def read(self) -> Any:
        header = await self._stdout.readexactly(_HEADER_BYTES)
        return json.loads(await self._stdout.readexactly(int.from_bytes(header, "big")))

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        # Its transport closes once the process is reaped and both pipes are closed.
        self._stdin.close()


class RenderPool:
    def __init__(self, *, workers: int, timeout_s: float, memory_bytes: int) -> None:
        self._size = workers
        self._timeout_s = timeout_s
        self._memory_bytes = memory_bytes
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._all: set[_Worker] = set()
        self._started: asyncio.Task[None] | None = None
        self._respawns: set[asyncio.Task[None]] = set()
        self._reapers: set[asyncio.Task[int]] = set()
        self.restarts = 0

    async def start(self) -> None:
        """Start the workers (once; later calls wait for that start)."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start_all())
        await asyncio.shield(self._started)

    async def _start_all(self) -> None:
        workers = await asyncio.gather(*(self._spawn() for _ in range(self._size)))
        for worker in workers:
            self._idle.put_nowait(worker)

    async def _spawn(self) -> _Worker:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [_PROJECT_ROOT, os.environ.get("PYTHONPATH")]))}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "services.tokenizer.render_worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
            # Its own session: a terminal's Ctrl-C goes to the tokenizer, which ends its workers (closing
            # their stdin, or killing them); a worker also ends when the tokenizer dies (stdin at EOF).
            start_new_session=True,
        )
        worker = _Worker(process)
        self._all.add(worker)
        try:
            reply = await asyncio.wait_for(worker.call({"memory_bytes": self._memory_bytes}), 60)
        except BaseException:
            self._discard(worker)
            raise
        if reply != {"ready": True}:
            self._discard(worker)
            raise RuntimeError(f"render worker did not start: {reply!r}")
        return worker

    async def render(self, arguments: dict[str, Any]) -> str:
        """chat_sandbox.render(**arguments) in a worker; any failure is an InvalidArgument."""
        await self.start()
        worker = await self._idle.get()
        try:
            reply = await asyncio.wait_for(worker.call(arguments), self._timeout_s)
        except TimeoutError:
            self._replace(worker)
            raise InvalidArgument(
                f"chat template took longer than {self._timeout_s:g} s to render (--chat-template-timeout)"
            ) from None
        except (asyncio.IncompleteReadError, ConnectionError):
            self._replace(worker)
            raise InvalidArgument("chat template rendering crashed its worker (out of memory?)") from None
        except BaseException:  # cancelled mid-render: its answer would reach the next request
            self._replace(worker)
            raise
        self._idle.put_nowait(worker)
        if "error" in reply:
            raise InvalidArgument(str(reply["error"]))
        return str(reply["text"])

    def _replace(self, worker: _Worker) -> None:
        self._discard(worker)
        self.restarts += 1
        task = asyncio.ensure_future(self._respawn())
        self._respawns.add(task)
        task.add_done_callback(self._respawns.discard)

    async def _respawn(self) -> None:
        delay = 0.1
        while True:
            try:
                self._idle.put_nowait(await self._spawn())
                return
            except Exception:
                log.exception("render worker failed to start; retrying in %.1f s", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        self._all.discard(worker)
        # Reaped in the background; nobody waits on a killed worker.
        task = asyncio.ensure_future(worker.process.wait())
        self._reapers.add(task)
        task.add_done_callback(self._reapers.discard)

    async def close(self) -> None:
        for task in list(self._respawns):
            task.cancel()
        await asyncio.gather(*self._respawns, return_exceptions=True)
        for worker in list(self._all):
            self._discard(worker)
        await asyncio.gather(*self._reapers, return_exceptions=True)
