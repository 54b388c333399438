"""A per-engine circuit breaker: stop sending to an engine that keeps failing requests.

    closed ──(failure_threshold failures in a row)──▶ open ──(cooldown over)──▶ half-open
      ▲                                                 ▲                          │
      └────────────(trial request succeeds)─────────────┼──(trial request fails)───┘

Half-open lets exactly one trial request through at a time. The health checker
resets the breaker when an engine it had marked unhealthy comes back, so a
restarted engine gets traffic at once. Only engine faults count as failures
(the engine died, broke a stream, or hit an internal error), never a request
the engine refused as invalid or a call the client cancelled.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable


class Circuit(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(self, failure_threshold: int, cooldown_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        # failure_threshold 0 turns the breaker off: it always stays closed.
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._trial_in_flight = False

    @property
    def state(self) -> Circuit:
        if self._opened_at is None:
            return Circuit.CLOSED
        if self._clock() - self._opened_at < self.cooldown_s:
            return Circuit.OPEN
        return Circuit.HALF_OPEN

    def allows(self) -> bool:
        """Whether a new request may be sent now."""
        state = self.state
        return state is Circuit.CLOSED or (state is Circuit.HALF_OPEN and not self._trial_in_flight)

    def on_dispatch(self) -> None:
        """A request was sent; in half-open it is the one trial."""
        if self.state is Circuit.HALF_OPEN:
            self._trial_in_flight = True

    def record_success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._trial_in_flight = False

    def record_failure(self) -> None:
        if self.failure_threshold == 0:
            return
        self._failures += 1
        if self.state is Circuit.HALF_OPEN or self._failures >= self.failure_threshold:
            self._opened_at = self._clock()
            self._trial_in_flight = False

    def release_trial(self) -> None:
        """A request ended with no verdict on the engine (the caller cancelled it)."""
        self._trial_in_flight = False

    def reset(self) -> None:
        self.record_success()
