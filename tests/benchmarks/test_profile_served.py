"""profile_served's bookkeeping: finding the stack's service processes under the launcher and
reading their CPU time, and summarising py-spy's raw stacks per thread."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from benchmarks.profile_served import cpu_seconds, service_pids, spy_summary


def test_services_are_found_under_the_launcher_by_their_command() -> None:
    # A launcher whose child runs a CPU loop with the argv shape of `python -m turnout.cli engine ...`.
    # It burns 0.4 s of its own CPU time (not of wall time: a busy machine may give it little).
    busy = "import time\nwhile time.process_time() < 0.4: pass\ntime.sleep(30)"
    idle = "import time; time.sleep(30)"
    script = f"{sys.executable} -c '{busy}' turnout.cli engine --model x & "
    script += f"{sys.executable} -c '{idle}' turnout.cli nothing & wait"
    launcher = subprocess.Popen(["sh", "-c", script])
    try:
        deadline = time.monotonic() + 10
        pids: dict[str, int] = {}
        while time.monotonic() < deadline and "engine" not in pids:
            pids = service_pids(launcher.pid)
            time.sleep(0.05)
        assert list(pids) == ["engine"]  # "nothing" is not a service
        while time.monotonic() < deadline + 50 and cpu_seconds(pids["engine"]) < 0.3:
            time.sleep(0.1)
        assert 0.3 <= cpu_seconds(pids["engine"]) < 5
        assert service_pids(launcher.pid + 10_000_000) == {}
    finally:
        subprocess.run(["pkill", "-P", str(launcher.pid)], check=False)
        launcher.kill()
        launcher.wait()


def test_spy_summary_groups_leaf_frames_by_thread(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "thread (1): loop;step (a.py:1);forward (b.py:2) 30\n"
        "thread (1): loop;step (a.py:1);sample (c.py:3) 10\n"
        "thread (2): main;select (s.py:9) 5\n"
    )
    lines = spy_summary(raw, top=5)
    assert lines[0] == "thread (1): loop: 40 samples"
    assert lines[1].split() == ["75.0%", "forward", "(b.py:2)"]
    assert "thread (2): main: 5 samples" in lines
