"""CPU binding: `turnout engine --cpu-cores`, `turnout serve --cpu-reserved-cores` (turnout/cpu_cores.py)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from services.engine.config import EngineConfig
from turnout import cpu_cores, launcher
from turnout.flags import declared, to_argv

CAN_BIND = cpu_cores.can_bind() and len(cpu_cores.allowed_cpus()) >= 2


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8", (0, 1, 2, 3, 8)), ("5", (5,)), (" 3,1,1-2 ", (1, 2, 3)), ("[4, 0, 4]", (0, 4))],
)
def test_cpu_lists_in_the_kernels_format_or_json(text: str, cpus: tuple[int, ...]) -> None:
    assert cpu_cores.parse_cpu_list(text) == cpus
    assert cpu_cores.parse_cpu_list(cpu_cores.show_cpu_list(cpus)) == cpus


@pytest.mark.parametrize("text", ["", "a", "3-1", "1,,2", "-1", "[1, true]", "[]", '{"a": 1}', "1.5"])
def test_a_bad_cpu_list_is_refused_with_what_was_given(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        cpu_cores.parse_cpu_list(text)
    assert "CPU" in str(refused.value)


def test_show_cpu_list_folds_runs() -> None:
    assert cpu_cores.show_cpu_list([8, 0, 1, 2, 3, 10, 11]) == "0-3,8,10-11"


def test_the_engine_flag_goes_to_a_child_and_back() -> None:
    (d,) = [d for d in declared(EngineConfig) if d.field == "cpu_cores"]
    words = to_argv(d, (0, 2, 3))
    assert words[0] == "--cpu-cores"
    assert cpu_cores.parse_cpu_list(words[1]) == (0, 2, 3)


def test_physical_cores_count_hyperthreads_once(tmp_path: Path) -> None:
    for cpu, siblings in {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}.items():
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(siblings + "\n")
    assert cpu_cores.physical_cores([0, 1, 2, 3], tmp_path) == 2
    assert cpu_cores.physical_cores([0, 2], tmp_path) == 1
    assert cpu_cores.physical_cores([0, 7], tmp_path) == 2  # cpu7 unknown to this sysfs: counted alone


def test_the_plan_reserves_the_first_cpus_and_splits_the_rest_evenly() -> None:
    plan = cpu_cores.plan_cores((0, 1, 2, 3, 4, 5, 6, 7), 1, 3)
    assert plan.services == (0,)
    assert plan.engines == ((1, 2, 3), (4, 5), (6, 7))
    assert cpu_cores.plan_cores((4, 9), 1, 1) == cpu_cores.CorePlan((4,), ((9,),))


def test_a_plan_that_leaves_a_replica_no_cpu_is_refused() -> None:
    with pytest.raises(ValueError, match=r"--cpu-reserved-cores 2 leaves 0 of the 2 CPUs .*0-1.* 1 engine"):
        cpu_cores.plan_cores((0, 1), 2, 1)
    with pytest.raises(ValueError, match=r"leaves 1 of the 2 CPUs .* 2 engine"):
        cpu_cores.plan_cores((0, 1), 1, 2)


def stack_for(monkeypatch: pytest.MonkeyPatch, argv: list[str], allowed: tuple[int, ...]) -> launcher.Stack:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(launcher.shutil, "which", lambda name: None)
    monkeypatch.setattr(launcher, "allowed_cpus", lambda: allowed)
    monkeypatch.setattr(launcher, "can_bind", lambda: True)
    args = launcher.build_parser().parse_args(["--model", "/m", *argv])
    return launcher.build_stack(args, Path("/m"))


def test_serve_gives_each_replica_its_share_and_the_services_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    stack = stack_for(monkeypatch, ["--engines", "2", "--cpu-reserved-cores", "2"], tuple(range(8)))
    by_name = {c.name: c for c in stack.children}
    for name, share in (("engine0", "2-4"), ("engine1", "5-7")):
        argv = by_name[name].argv
        assert argv[argv.index("--cpu-cores") + 1] == share
        # Its event loop with the services, its team on its share; the team sized by the engine, not OMP_NUM_THREADS.
        assert by_name[name].cpus == (0, 1, *cpu_cores.parse_cpu_list(share))
        assert by_name[name].env == {}
    for name in ("tokenizer", "router", "gateway"):
        assert by_name[name].cpus == (0, 1)
        assert "--cpu-cores" not in by_name[name].argv


def test_serve_binds_nothing_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = stack_for(monkeypatch, [], (0, 1))
    assert all(c.cpus == () for c in stack.children)
    assert "--cpu-cores" not in stack.children[0].argv


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cpu-reserved-cores", "1", "--cpu-cores", "1"], "not both"),
        (["--cpu-reserved-cores", "2"], "leaves 0 of the 2 CPUs"),
        (["--cpu-reserved-cores", "1", "--engines", "2"], "leaves 1 of the 2 CPUs"),
    ],
)
def test_serve_refuses_a_plan_it_cannot_keep(monkeypatch: pytest.MonkeyPatch, argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stack_for(monkeypatch, argv, (0, 1))


def test_serve_refuses_a_negative_reservation() -> None:
    with pytest.raises(ValueError, match="--cpu-reserved-cores must be 0 or more"):
        launcher.serve_config(launcher.build_parser().parse_args(["--model", "/m", "--cpu-reserved-cores", "-1"]))


# The binding itself changes the calling process's affinity: measured in a process of its own.
BIND_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, threading
    os.environ.pop("OMP_NUM_THREADS", None)
    import torch
    from turnout import cpu_cores
    compute = tuple(json.loads(sys.argv[1]))
    done = threading.Event()
    before = threading.Thread(target=done.wait)  # a thread the process had before: moved too
    before.start()
    others = cpu_cores.bind_process_outside(compute)
    earlier = sorted(os.sched_getaffinity(before.native_id))
    done.set()
    seen = {}
    def step():
        seen["threads"] = cpu_cores.bind_compute_thread(compute)
        torch.ones(1 << 16).add_(1)  # opens the OpenMP team here
        seen["step"] = sorted(os.sched_getaffinity(0))
        seen["torch_threads"] = torch.get_num_threads()
    thread = threading.Thread(target=step)
    thread.start()
    thread.join()
    tasks = {int(t): sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
    print(json.dumps({"others": list(others), "main": sorted(os.sched_getaffinity(0)), "earlier": earlier, "seen": seen,
                      "env": os.environ["OMP_NUM_THREADS"], "tasks": list(tasks.values())}))
    """
)


@pytest.mark.skipif(not CAN_BIND, reason="needs Linux and 2 CPUs to bind to")
def test_the_step_thread_runs_on_its_cpus_and_every_other_thread_elsewhere() -> None:
    allowed = cpu_cores.allowed_cpus()
    compute = [allowed[-1]]
    out = subprocess.run(
        [sys.executable, "-c", BIND_SCRIPT, json.dumps(compute)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    got = json.loads(out.stdout.splitlines()[-1])
    rest = [c for c in allowed if c not in compute]
    assert got["others"] == rest
    assert got["main"] == rest
    assert got["earlier"] == rest
    assert got["seen"] == {"threads": 1, "step": compute, "torch_threads": 1}
    assert got["env"] == "1"  # what tensor-parallel ranks split
    # torch's threads (the OpenMP team's workers, if any) run on the compute CPUs or, started before, elsewhere:
    # none runs on both.
    assert all(mask in (rest, compute) for mask in got["tasks"])


@pytest.mark.skipif(not CAN_BIND, reason="needs Linux and 2 CPUs to bind to")
def test_the_engine_refuses_cpus_it_may_not_use() -> None:
    with pytest.raises(ValueError, match=r"--cpu-cores lists CPUs this process may not use: 4096 \(it may use "):
        cpu_cores.bind_process_outside((4096,))
    assert os.sched_getaffinity(0) == set(cpu_cores.allowed_cpus())  # nothing changed


def test_binding_a_process_that_is_gone_does_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    cpu_cores.bind_process(child.pid, cpu_cores.allowed_cpus())  # reaped: no /proc entry, no error
