"""A grammar compiler in a process of its own, so a compile that runs too long can be stopped.

xgrammar compiles in C++: a thread running it cannot be interrupted, a process can be killed.
The worker holds an xgrammar.GrammarCompiler over the model's TokenizerInfo (sent once,
serialized), compiles one constraint at a time and sends the result back serialized
(`CompiledGrammar.serialize_json`); the engine deserializes it against its own TokenizerInfo,
whose metadata is the same. xgrammar's own cache is off in the worker: the engine's cache
(compiler.py) keeps the compiled grammars, so killing a worker loses nothing.

    engine -> worker   the serialized TokenizerInfo once, then Constraints
    worker -> engine   ("ready",) once started, then per constraint ("ok", serialized) or ("error", message)

The worker is started before the TokenizerInfo is made, and reads it once it has imported xgrammar:
the engine's first grammar pays for the two (loading the tokenizer, ~4 s; a new process importing
xgrammar and torch, ~3.5 s) side by side rather than one after the other.

Workers are started with `spawn` (the engine has threads; forking them is unsafe) and die with
the engine (PR_SET_PDEATHSIG, and EOF on their pipe).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from services.engine.grammar.constraint import Constraint
from services.engine.grammar.xgrammar_build import xgrammar_reason
from turnout.errors import InvalidArgument, TurnoutError, Unavailable

log = logging.getLogger(__name__)

# (xgrammar.GrammarCompiler, Constraint) -> xgrammar.CompiledGrammar; a module-level function (it is
# pickled into the worker). Tests pass their own to hold or slow a compile.
Build = Callable[[Any, Constraint], Any]

_PR_SET_PDEATHSIG = 1
# Importing xgrammar (torch, transformers) and reading the TokenizerInfo; not counted in a compile's time.
STARTUP_TIMEOUT_S = 180.0


class CompileTimeout(Exception):
    """The compile ran past its time limit (the worker has been killed)."""


class WorkerDied(Exception):
    """The worker process ended during a compile: killed (cancelled), or crashed on the constraint."""


class CompileWorker:
    def __init__(self, tokenizer_info_json: Callable[[], str], build: Build) -> None:
        """`tokenizer_info_json` is called while the new process starts (it may load the tokenizer)."""
        context = multiprocessing.get_context("spawn")
        # Set before the process is killed: once set, the worker is never used again. `is_alive()` alone
        # cannot say so, since two threads reaping one process (the killer's join and the slot's poll)
        # can leave the loser believing it still runs.
        self._killed = False
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, build), name="grammar-compile", daemon=True)
        self.process.start()
        child.close()
        try:
            info = tokenizer_info_json()
        except BaseException:
            self.kill()
            raise
        try:
            self._conn.send(info)
        except (EOFError, OSError):
            self.kill()
            raise Unavailable(f"the grammar compile worker exited at start ({self.process.exitcode})") from None
        if not self._conn.poll(STARTUP_TIMEOUT_S):
            self.kill()
            raise Unavailable(f"the grammar compile worker did not start within {STARTUP_TIMEOUT_S:g} s")
        try:
            self._conn.recv()
        except EOFError:
            self.kill()
            raise Unavailable(f"the grammar compile worker exited at start ({self.process.exitcode})") from None

    @property
    def alive(self) -> bool:
        return not self._killed and self.process.is_alive()

    def compile(self, constraint: Constraint, timeout_s: float) -> str:
        """The serialized compiled grammar. InvalidArgument: it does not compile; CompileTimeout: it took
        longer than timeout_s (the worker is killed); WorkerDied: the worker ended meanwhile."""
        try:
            self._conn.send(constraint)
            if not self._conn.poll(timeout_s):
                self.kill()
                raise CompileTimeout()
            status, payload = self._conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise WorkerDied(f"exit code {self.process.exitcode}") from None
        if status == "error":
            raise InvalidArgument(payload)
        return str(payload)

    def kill(self) -> None:
        """SIGKILL (safe from any thread): a compile in progress ends with WorkerDied."""
        self._killed = True
        with contextlib.suppress(OSError, ValueError):
            self.process.kill()
            self.process.join(timeout=10)


def _serve(conn: Connection, build: Build) -> None:
    # The engine ends its workers; a terminal's Ctrl-C, sent to the whole process group, is the engine's.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    import xgrammar as xgr  # while the engine makes the TokenizerInfo

    try:
        tokenizer_info_json = conn.recv()
    except (EOFError, OSError):
        return
    info = xgr.TokenizerInfo.deserialize_json(tokenizer_info_json)
    compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
    conn.send(("ready",))
    while True:
        try:
            constraint = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply = ("ok", build(compiler, constraint).serialize_json())
        except TurnoutError as exc:
            reply = ("error", str(exc))
        except Exception as exc:
            reply = ("error", f"{constraint.kind}: the constraint does not compile: {xgrammar_reason(exc)}")
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return
