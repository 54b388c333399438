"""bench_startup: one start of the tokenizer and the router, each reported with its numbers (the tokenizer
without torch); the whole stack's process tree and ready line, without starting one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.bench_startup import _process_tree, _started, main
from turnout.ready_summary import READY_PREFIX


def test_each_service_started_is_reported(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    services = ["tokenizer", "router"]
    main(["--model", str(tiny_model_dir), "--services", *services, "--repeats", "1", "--log", str(tmp_path / "log")])
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines()[2:]}
    assert sorted(rows) == sorted(services), rows
    for row in rows.values():
        wall, cpu, rss, torch_loaded = (cell.strip() for cell in row.split("|")[2:6])
        assert float(wall) > 0 and float(cpu) > 0 and float(rss) > 0, row
        assert torch_loaded == "no", row


def test_the_stack_counts_every_descendant_and_starts_at_its_own_ready_line(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"]
    )
    try:
        deadline = time.monotonic() + 30
        while len(tree := _process_tree(child.pid)) < 2:  # the child, then its sleep
            assert time.monotonic() < deadline, tree
            time.sleep(0.05)
        assert tree[0] == child.pid and os.getpid() not in tree
    finally:
        for pid in _process_tree(child.pid)[::-1]:
            os.kill(pid, signal.SIGKILL)
        child.wait()
    log = tmp_path / "log"
    log.write_bytes(f"{READY_PREFIX}http://old\n".encode())  # an earlier start's line
    size_before = log.stat().st_size
    assert not _started("serve", 0, log, size_before)
    with log.open("ab") as out:
        out.write(f"{READY_PREFIX}http://127.0.0.1:1\n".encode())
    assert _started("serve", 0, log, size_before)
