"""A child of `turnout serve` dies with the launcher, even when the launcher is SIGKILLed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

PARENT = textwrap.dedent(
    """
    import sys, time
    from turnout.child_processes import Child, free_port

    argv = [sys.executable, "-m", "turnout.cli", "router", "--tokenizer", "127.0.0.1:1",
            "--engine", "127.0.0.1:2", "--port", str(free_port())]
    child = Child("router", argv, lambda: True, 0)
    child.start()
    print(child.process.pid, flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (dead, not yet reaped by init) counts as gone.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_children_die_with_a_killed_launcher() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        time.sleep(4)  # the child's `turnout` command has started and asked for the signal
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 20
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(child), "the child outlived its launcher"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)
