"""Router settings: one frozen dataclass, validated on creation.

Every field but the metrics port and security is a `turnout router` flag, declared here (its
default, help and name); errors name the flag so a wrong command line is easy to fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from turnout.flags import flag
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
    engines: tuple[str, ...] = flag(
        (),
        "an engine, HOST:PORT (repeatable); a DNS name stands for every address it resolves to",
        name="--engine",
        metavar="HOST:PORT",
        append=True,
    )
    tokenizers: tuple[str, ...] = flag(
        (),
        "a tokenizer service, HOST:PORT (repeatable; at least one)",
        name="--tokenizer",
        metavar="HOST:PORT",
        append=True,
    )
    host: str = flag("127.0.0.1", "address the gRPC service listens on")
    port: int = flag(50050, "port the gRPC service listens on")

    # Routing.
    policy: str = flag("cache_aware", "how a request picks its engine", choices=POLICIES)
    # cache_aware: go to the engine with the longest remembered prefix when it covers more than
    # this share of the prompt, and the loads are balanced (see policies.CacheAware).
    cache_threshold: float = flag(
        0.5, "cache_aware: share of the prompt an engine's remembered prefix must cover to win"
    )
    # Loads are imbalanced when max - min > abs AND max > min * rel; then the least loaded engine wins.
    balance_abs_threshold: int = flag(32, "cache_aware: loads are imbalanced when max - min exceeds this ...")
    balance_rel_threshold: float = flag(1.5, "... and max exceeds min times this; then the least loaded engine wins")
    # Prompt tokens remembered per engine; the least recently used branches go first.
    max_tree_size: int = flag(1 << 20, "cache_aware: prompt tokens remembered per engine, LRU-evicted")

    # Engines' health and load, watched in the background.
    health_check_interval_s: float = flag(
        2.0, "seconds between health checks of an engine", name="--health-check-interval", metavar="SECONDS"
    )
    health_check_timeout_s: float = flag(
        1.0, "seconds a health check may take", name="--health-check-timeout", metavar="SECONDS"
    )
    # Consecutive failed checks that mark a healthy engine unhealthy, and passed ones that bring it back.
    health_failure_threshold: int = flag(3, "failed checks in a row that mark an engine unhealthy")
    health_success_threshold: int = flag(2, "passed checks in a row that bring it back")
    # How often each engine's GetLoad is polled (0: never; the router's own in-flight count remains).
    load_poll_interval_s: float = flag(
        0.5, "how often engines' GetLoad is polled; 0: never", name="--load-poll-interval", metavar="SECONDS"
    )
    # How often DNS names among `engines` are resolved again.
    dns_refresh_interval_s: float = flag(
        5.0, "how often --engine DNS names are resolved again", name="--dns-refresh-interval", metavar="SECONDS"
    )

    # Faults. A request whose engine fails before the first token is retried on another one.
    max_retries: int = flag(2, "retries on another engine of a request that failed before its first token")
    # The first retry waits this long; each further one twice as long (capped at 1 s).
    retry_backoff_s: float = flag(
        0.02,
        "seconds before the first retry; doubled for each further one (at most 1 s)",
        name="--retry-backoff",
        metavar="SECONDS",
    )
    # Consecutive failed requests that open an engine's circuit (0: no breaker), and how long it stays open.
    circuit_breaker_failures: int = flag(5, "failed requests in a row that stop traffic to an engine; 0: off")
    circuit_breaker_cooldown_s: float = flag(
        10.0, "seconds an engine's circuit stays open", name="--circuit-breaker-cooldown", metavar="SECONDS"
    )

    # A request waits this long for a tokenizer that is down (restarting) to come back, then fails UNAVAILABLE.
    tokenizer_ready_timeout_s: float = flag(
        5.0,
        "how long a request waits for a tokenizer that is down (restarting) before UNAVAILABLE; 0: no wait",
        name="--tokenizer-ready-timeout",
        metavar="SECONDS",
    )

    # Admission: Generate streams open at once, how many may wait for a slot, and for how long.
    max_concurrent_requests: int = flag(1024, "Generate streams open at once")
    max_queued_requests: int = flag(1024, "streams waiting for a slot; beyond: RESOURCE_EXHAUSTED")
    queue_timeout_s: float = flag(
        30.0, "longest wait for a slot before RESOURCE_EXHAUSTED", name="--queue-timeout", metavar="SECONDS"
    )

    # The router's line per Generate request costs ~0.1 ms of its CPU, a fifth of a short request's; vLLM
    # (--enable-log-requests) and SGLang (--log-requests) log requests only when asked, too.
    # Spelled as the gateway's access-log flag, so `turnout serve --enable-log-requests` asks both.
    enable_log_requests: bool = flag(
        False,
        "log one line per Generate request at its end: engine, route, token counts, status, seconds",
        aliases=("--log-requests",),
        negations=("--disable-log-requests",),
    )

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
        for name, (value, low) in at_least.items():
            if value < low:
                raise ValueError(f"{name} must be >= {low}, got {value}")
        positive = {
            "--health-check-interval": self.health_check_interval_s,
            "--health-check-timeout": self.health_check_timeout_s,
            "--dns-refresh-interval": self.dns_refresh_interval_s,
            "--queue-timeout": self.queue_timeout_s,
        }
        for name, seconds in positive.items():
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {seconds}")
        non_negative = {
            "--load-poll-interval": self.load_poll_interval_s,
            "--retry-backoff": self.retry_backoff_s,
            "--circuit-breaker-cooldown": self.circuit_breaker_cooldown_s,
            "--tokenizer-ready-timeout": self.tokenizer_ready_timeout_s,
        }
        for name, seconds in non_negative.items():
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ValueError(f"{name} must be >= 0 seconds, got {seconds}")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ValueError(f"--metrics-port must be a port number, got {self.metrics_port}")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def retry_delay_s(self, retry: int) -> float:
        """How long to wait before retry number `retry` (1, 2, ...)."""
        return min(self.retry_backoff_s * 2 ** (retry - 1), 1.0)
