"""Router settings: one frozen dataclass, validated on creation.

Every field is a `turnout router` flag (see main.py, which documents the
defaults); errors name the flag so a wrong command line is easy to fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from turnout.security import ServiceSecurity

POLICIES = ("round_robin", "random", "power_of_two", "least_load", "cache_aware")


def check_address(address: str, flag: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{flag} {address!r}: expected HOST:PORT")


@dataclass(frozen=True)
class RouterConfig:
    # Engine addresses (HOST:PORT; a HOST that is a DNS name stands for every address it resolves to).
    # May be empty: engines can be added at run time with the RouterAdmin service.
    engines: tuple[str, ...]
    tokenizers: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 50050

    # Routing.
    policy: str = "cache_aware"
    # cache_aware: go to the engine with the longest remembered prefix when it covers more than
    # this share of the prompt, and the loads are balanced (see policies.CacheAware).
    cache_threshold: float = 0.5
    # Loads are imbalanced when max - min > abs AND max > min * rel; then the least loaded engine wins.
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.5
    # Prompt tokens remembered per engine; the least recently used branches go first.
    max_tree_size: int = 1 << 20

    # Engines' health and load, watched in the background.
    health_check_interval_s: float = 2.0
    health_check_timeout_s: float = 1.0
    # Consecutive failed checks that mark a healthy engine unhealthy, and passed ones that bring it back.
    health_failure_threshold: int = 3
    health_success_threshold: int = 2
    # How often each engine's GetLoad is polled (0: never; the router's own in-flight count remains).
    load_poll_interval_s: float = 0.5
    # How often DNS names among `engines` are resolved again.
    dns_refresh_interval_s: float = 5.0

    # Faults. A request whose engine fails before the first token is retried on another one.
    max_retries: int = 2
    # The first retry waits this long; each further one twice as long (capped at 1 s).
    retry_backoff_s: float = 0.02
    # Consecutive failed requests that open an engine's circuit (0: no breaker), and how long it stays open.
    circuit_breaker_failures: int = 5
    circuit_breaker_cooldown_s: float = 10.0

    # A request waits this long for a tokenizer that is down (restarting) to come back, then fails UNAVAILABLE.
    tokenizer_ready_timeout_s: float = 5.0

    # Admission: Generate streams open at once, how many may wait for a slot, and for how long.
    max_concurrent_requests: int = 1024
    max_queued_requests: int = 1024
    queue_timeout_s: float = 30.0

    # Port of the Prometheus /metrics HTTP endpoint (None: not served).
    metrics_port: int | None = None
    # Who may call this service, and TLS (turnout/security.py; the CLI refuses to start without a token).
    security: ServiceSecurity = field(default_factory=ServiceSecurity)

    def __post_init__(self) -> None:
        if not self.tokenizers:
            raise ValueError("at least one --tokenizer address is needed")
        for address in self.engines:
            check_address(address, "--engine")
        for address in self.tokenizers:
            check_address(address, "--tokenizer")
        if self.policy not in POLICIES:
            raise ValueError(f"--policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"--cache-threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_rel_threshold < 1.0:
            raise ValueError(f"--balance-rel-threshold must be >= 1, got {self.balance_rel_threshold}")
        at_least = {
            "--balance-abs-threshold": (self.balance_abs_threshold, 0),
            "--max-tree-size": (self.max_tree_size, 1),
            "--health-failure-threshold": (self.health_failure_threshold, 1),
            "--health-success-threshold": (self.health_success_threshold, 1),
            "--max-retries": (self.max_retries, 0),
            "--circuit-breaker-failures": (self.circuit_breaker_failures, 0),
            "--max-concurrent-requests": (self.max_concurrent_requests, 1),
            "--max-queued-requests": (self.max_queued_requests, 0),
        }
        for flag, (value, low) in at_least.items():
            if value < low:
                raise ValueError(f"{flag} must be >= {low}, got {value}")
        positive = {
            "--health-check-interval": self.health_check_interval_s,
            "--health-check-timeout": self.health_check_timeout_s,
            "--dns-refresh-interval": self.dns_refresh_interval_s,
            "--queue-timeout": self.queue_timeout_s,
        }
        for flag, seconds in positive.items():
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"{flag} must be a positive number of seconds, got {seconds}")
        non_negative = {
            "--load-poll-interval": self.load_poll_interval_s,
            "--retry-backoff": self.retry_backoff_s,
            "--circuit-breaker-cooldown": self.circuit_breaker_cooldown_s,
            "--tokenizer-ready-timeout": self.tokenizer_ready_timeout_s,
        }
        for flag, seconds in non_negative.items():
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"{flag} must be >= 0 seconds, got {seconds}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ValueError(f"--metrics-port must be a port number, got {self.metrics_port}")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def retry_delay_s(self, retry: int) -> float:
        """How long to wait before retry number `retry` (1, 2, ...)."""
        return min(self.retry_backoff_s * 2 ** (retry - 1), 1.0)
