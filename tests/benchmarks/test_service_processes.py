"""The ceiling's CPU columns: a service's helper processes (the tokenizer's render workers) count as the
service's, its own process first."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from benchmarks import service_ceiling

_SLEEP = "import time; time.sleep(60)"
# A "tokenizer" (its argv names turnout.cli and the service) that starts a helper of its own.
_TOKENIZER = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {_SLEEP!r}]); time.sleep(60)"
_LAUNCHER = (
    "import subprocess, sys, time; "
    f"subprocess.Popen([sys.executable, '-c', {_TOKENIZER!r}, 'turnout.cli', 'tokenizer']); "
    f"subprocess.Popen([sys.executable, '-c', {_SLEEP!r}, 'turnout.cli', 'router']); time.sleep(60)"
)


def test_a_services_helpers_are_counted_with_it_and_its_own_process_comes_first() -> None:
    launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER])
    try:
        tree = psutil.Process(launcher.pid)
        deadline = time.monotonic() + 30
        while len(tree.children(recursive=True)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = service_ceiling.service_processes(launcher.pid)
        assert sorted(found) == ["router", "tokenizer"]
        tokenizer = found["tokenizer"].processes
        assert len(tokenizer) == 2
        assert "turnout.cli" in tokenizer[0].cmdline()  # the service itself: the pid that is profiled
        assert tokenizer[1].parent().pid == tokenizer[0].pid  # its helper
        assert len(found["router"].processes) == 1
    finally:
        for process in [*psutil.Process(launcher.pid).children(recursive=True), psutil.Process(launcher.pid)]:
            process.kill()
        launcher.wait()
