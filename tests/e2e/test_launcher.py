"""`turnout serve` starts the four services and stops them all on SIGTERM."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.e2e.stack import port_in_use, start_stack

pytestmark = pytest.mark.e2e


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


@pytest.mark.parametrize("ctrl_c", [False, True], ids=["sigterm", "ctrl-c"])
def test_stop_signal_stops_every_child_and_frees_every_port(tiny_model_dir: Path, tmp_path: Path, ctrl_c: bool) -> None:
    stack = start_stack(tiny_model_dir, tmp_path / "stack.log")
    children = children_of(stack.process.pid)
    assert len(children) == 4, stack.log()
    assert all(port_in_use(p) for p in stack.ports)
    assert httpx.get(f"{stack.base_url}/v1/models").status_code == 200

    took = stack.stop(ctrl_c=ctrl_c)

    assert stack.process.returncode == 0, stack.log()
    assert took < 10, f"stopping took {took:.1f}s"
    assert not [pid for pid in children if alive(pid)]
    assert not [p for p in stack.ports if port_in_use(p)]
    assert "Traceback" not in stack.log()
