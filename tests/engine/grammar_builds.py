"""Builds for compile workers in tests: module-level, so they can be pickled into the worker process."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from services.engine.grammar.constraint import Constraint
from services.engine.grammar.xgrammar_build import build

# A file path: held_build waits until it exists (and creates PATH.started once it is waiting).
HOLD_ENV = "TURNOUT_TEST_GRAMMAR_HOLD"


def held_build(compiler: Any, constraint: Constraint) -> Any:
    path = Path(os.environ[HOLD_ENV])
    Path(f"{path}.started").touch()
    deadline = time.monotonic() + 120
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return build(compiler, constraint)


def crashing_build(compiler: Any, constraint: Constraint) -> Any:
    """Dies as a C++ crash would on the regex "crash"; compiles anything else."""
    if constraint.text == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    return build(compiler, constraint)
