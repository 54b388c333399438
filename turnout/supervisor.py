"""Keeping the children of `turnout serve` running: restart with backoff, give up on a crash loop.

A child that dies is started again with the same command line, so on the same ports: the router
and the gateway reconnect by themselves, and the other children keep serving meanwhile. Each
restart waits `backoff_s`, doubled for every earlier restart of that child within `window_s`
(capped at `max_backoff_s`). A child that dies again after `max_restarts` restarts within
`window_s` is in a crash loop: the supervisor gives up, and the launcher stops the stack and
exits 1 (systemd's StartLimitBurst / StartLimitIntervalSec, with Kubernetes' doubling backoff).

Everything here runs on the launcher's main thread: a child's PR_SET_PDEATHSIG follows the
thread that started it, so a restarted child still dies with the launcher.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter

from turnout.child_processes import Child, Stack

log = logging.getLogger(__name__)

# How often the supervisor looks at its children (seconds).
POLL_S = 0.2


@dataclass(frozen=True)
class RestartPolicy:
    """When and how often `turnout serve` restarts a child that died. Each field is a flag."""

    max_restarts: int = field(
        default=5,
        metadata={
            "flag": "--max-restarts",
            "help": "restarts of one child within --restart-window before the "
            "stack gives up and exits 1; 0: never restart (default: %(default)s)",
        },
    )
    window_s: float = field(
        default=60.0,
        metadata={
            "flag": "--restart-window",
            "help": "seconds over which a child's restarts are counted (default: %(default)s)",
        },
    )
    backoff_s: float = field(
        default=0.5,
        metadata={
            "flag": "--restart-backoff",
            "help": "seconds before the first restart of a child; doubled for "
            "each further restart within the window (default: %(default)s)",
        },
    )
    max_backoff_s: float = field(
        default=8.0,
        metadata={"flag": "--max-restart-backoff", "help": "longest wait before a restart (default: %(default)s)"},
    )

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"--max-restarts must be >= 0, got {self.max_restarts}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "float" and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{f.metadata['flag']} must be >= 0 seconds, got {value}")
        if self.window_s <= 0:
            raise ValueError(f"--restart-window must be > 0 seconds, got {self.window_s}")

    def backoff(self, attempt: int) -> float:
        """Seconds to wait before restart number `attempt` (1, 2, ...) within the window."""
        return min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)


def add_restart_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("restarts (a child that dies is restarted; a crash loop stops the stack)")
    for f in dataclasses.fields(RestartPolicy):
        kind, metavar = (int, "N") if f.type == "int" else (float, "SECONDS")
        group.add_argument(
            f.metadata["flag"],
            dest=f"restart_{f.name}",
            type=kind,
            default=f.default,
            metavar=metavar,
            help=f.metadata["help"],
        )


def restart_policy_from_args(args: argparse.Namespace) -> RestartPolicy:
    return RestartPolicy(**{f.name: getattr(args, f"restart_{f.name}") for f in dataclasses.fields(RestartPolicy)})


@dataclass(frozen=True)
class Restart:
    """Start the child again after `backoff_s`; this is its `attempt`-th restart within the window."""

    attempt: int
    backoff_s: float


@dataclass(frozen=True)
class GiveUp:
    """The child died again after `restarts` restarts within the window: a crash loop."""

    restarts: int


class RestartHistory:
    """One child's recent restarts, and what to do when it dies again."""

    def __init__(self, policy: RestartPolicy, clock: Callable[[], float] = time.monotonic) -> None:
        self._policy = policy
        self._clock = clock
        self._restarts: list[float] = []

    def on_exit(self) -> Restart | GiveUp:
        now = self._clock()
        self._restarts = [t for t in self._restarts if now - t < self._policy.window_s]
        if len(self._restarts) >= self._policy.max_restarts:
            return GiveUp(len(self._restarts))
        self._restarts.append(now)
        attempt = len(self._restarts)
        return Restart(attempt, self._policy.backoff(attempt))


def describe_exit(returncode: int) -> dict[str, object]:
    """A child's exit as log fields: its exit code, or the signal that ended it."""
    if returncode < 0:
        try:
            return {"signal": signal.Signals(-returncode).name}
        except ValueError:
            return {"signal": -returncode}
    return {"exit_code": returncode}


class Supervisor:
    """Watches a started `Stack` until it is asked to stop; restarts children that die."""

    def __init__(
        self,
        stack: Stack,
        policy: RestartPolicy,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._stack = stack
        self._policy = policy
        self._clock = clock
        self._sleep = sleep
        self._history = {c.name: RestartHistory(policy, clock) for c in stack.children}
        self.restarts = Counter(
            "turnout_launcher_child_restarts",
            "Children of turnout serve started again after they died.",
            ["child"],
            registry=registry,
        )
        for child in stack.children:
            self.restarts.labels(child=child.name)  # every series exists from the start, at 0

    def run(self) -> bool:
        """Keep every child running until a stop is requested (True) or one is in a crash loop (False)."""
        # Children waiting for their restart: name -> when it is due.
        due: dict[str, float] = {}
        while not self._stack.stopping:
            now = self._clock()
            for child in self._stack.children:
                if child.name in due:
                    if now >= due[child.name]:
                        del due[child.name]
                        child.start()
                    continue
                returncode = child.exited
                if returncode is None:
                    continue
                when = self._on_exit(child, returncode, now)
                if when is None:
                    return False
                due[child.name] = when
            self._sleep(POLL_S)
        return True

    def _on_exit(self, child: Child, returncode: int, now: float) -> float | None:
        """Log and count the death of `child`; when to start it again, None to give up."""
        decision = self._history[child.name].on_exit()
        fields = {"child": child.name, **describe_exit(returncode)}
        if isinstance(decision, GiveUp):
            p = self._policy
            log.error(
                f"giving up: {child.name} died again after {decision.restarts} restarts within "
                f"{p.window_s:g} s (--max-restarts {p.max_restarts}, --restart-window {p.window_s:g}); "
                "stopping every service",
                extra=fields,
            )
            return None
        log.warning(
            "child died; restarting it",
            extra={**fields, "attempt": decision.attempt, "backoff_s": decision.backoff_s},
        )
        self.restarts.labels(child=child.name).inc()
        return now + decision.backoff_s
