"""The restart policy of `turnout serve` on a fake clock: backoff, the window, giving up."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry

from turnout.child_processes import Child, Stack
from turnout.supervisor import (
    GiveUp,
    Restart,
    RestartHistory,
    RestartPolicy,
    Supervisor,
    add_restart_flags,
    restart_policy_from_args,
)


@dataclass
class FakeClock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_backoff_doubles_up_to_its_cap_then_a_crash_loop_gives_up() -> None:
    clock = FakeClock()
    history = RestartHistory(RestartPolicy(max_restarts=5, window_s=60, backoff_s=0.5, max_backoff_s=4), clock)
    decisions = []
    for _ in range(6):
        decisions.append(history.on_exit())
        clock.now += 1
    assert decisions == [Restart(1, 0.5), Restart(2, 1.0), Restart(3, 2.0), Restart(4, 4.0), Restart(5, 4.0), GiveUp(5)]


def test_restarts_older_than_the_window_no_longer_count() -> None:
    clock = FakeClock()
    history = RestartHistory(RestartPolicy(max_restarts=2, window_s=60, backoff_s=1, max_backoff_s=8), clock)
    assert history.on_exit() == Restart(1, 1)
    clock.now += 30
    assert history.on_exit() == Restart(2, 2)
    clock.now += 31  # the first restart left the window: one remains, and the backoff follows
    assert history.on_exit() == Restart(2, 2)
    clock.now += 1
    assert history.on_exit() == GiveUp(2)
    clock.now += 120  # stable for a while: a fresh start
    assert history.on_exit() == Restart(1, 1)


def test_zero_restarts_is_a_fuse() -> None:
    assert RestartHistory(RestartPolicy(max_restarts=0), FakeClock()).on_exit() == GiveUp(0)


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--max-restarts", "-1"], "--max-restarts"),
        (["--restart-window", "0"], "--restart-window"),
        (["--restart-backoff", "nan"], "--restart-backoff"),
        (["--max-restart-backoff", "-2"], "--max-restart-backoff"),
    ],
)
def test_flags_are_the_policy_fields_and_bad_values_name_the_flag(argv: list[str], flag: str) -> None:
    parser = argparse.ArgumentParser()
    add_restart_flags(parser)
    assert restart_policy_from_args(parser.parse_args([])) == RestartPolicy()
    policy = restart_policy_from_args(parser.parse_args(["--max-restarts", "2", "--restart-window", "9"]))
    assert (policy.max_restarts, policy.window_s) == (2, 9.0)
    with pytest.raises(ValueError, match=flag):
        restart_policy_from_args(parser.parse_args(argv))


@dataclass
class FakeProcess:
    """A child process that dies when told to."""

    pid: int
    returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


@dataclass
class FakeChild(Child):
    pids: list[int] = field(default_factory=list)

    def start(self) -> None:
        self.pids.append(len(self.pids) + 1)
        self.process = FakeProcess(self.pids[-1])  # type: ignore[assignment]


def fake_stack() -> tuple[Stack, FakeChild, FakeChild]:
    engine = FakeChild("engine", [], lambda: True)
    router = FakeChild("router", [], lambda: True)
    for child in (engine, router):
        child.start()
    return Stack([engine, router]), engine, router


def test_supervisor_restarts_a_dead_child_after_its_backoff_and_counts_it(caplog: pytest.LogCaptureFixture) -> None:
    stack, engine, router = fake_stack()
    clock = FakeClock()
    registry = CollectorRegistry()
    policy = RestartPolicy(max_restarts=3, window_s=60, backoff_s=1, max_backoff_s=8)
    supervisor = Supervisor(stack, policy, registry, clock, clock.sleep)
    kills = iter([(1.0, -9), (3.0, 1), (100.0, None)])
    at, code = next(kills)

    def sleep(seconds: float) -> None:
        nonlocal at, code
        clock.sleep(seconds)
        if clock.now >= 1000 + at and code is not None:
            assert engine.process is not None
            engine.process.returncode = code  # type: ignore[misc]
            at, code = next(kills)
        if clock.now > 1010:
            stack.stopping = True

    supervisor._sleep = sleep
    with caplog.at_level(logging.WARNING):
        assert supervisor.run() is True
    assert engine.pids == [1, 2, 3] and router.pids == [1]
    restarts = [r for r in caplog.records if r.getMessage() == "child died; restarting it"]
    assert [(r.child, getattr(r, "signal", None), getattr(r, "exit_code", None)) for r in restarts] == [  # type: ignore[attr-defined]
        ("engine", "SIGKILL", None),
        ("engine", None, 1),
    ]
    assert [(r.attempt, r.backoff_s) for r in restarts] == [(1, 1.0), (2, 2.0)]  # type: ignore[attr-defined]
    assert registry.get_sample_value("turnout_launcher_child_restarts_total", {"child": "engine"}) == 2
    assert registry.get_sample_value("turnout_launcher_child_restarts_total", {"child": "router"}) == 0


def test_supervisor_gives_up_on_a_crash_loop(caplog: pytest.LogCaptureFixture) -> None:
    stack, engine, _ = fake_stack()
    clock = FakeClock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        assert engine.process is not None
        engine.process.returncode = 3  # type: ignore[misc]  # dies as soon as it is started
        assert clock.now < 1100, "never gave up"

    policy = RestartPolicy(max_restarts=2, window_s=60, backoff_s=0.5, max_backoff_s=8)
    with caplog.at_level(logging.ERROR):
        assert Supervisor(stack, policy, CollectorRegistry(), clock, sleep).run() is False
    assert engine.pids == [1, 2, 3]
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert line.startswith("giving up: engine died again after 2 restarts within 60 s (--max-restarts 2")
