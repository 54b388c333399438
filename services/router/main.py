"""`turnout router`: the public Inference gRPC service in front of engines and tokenizers."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from typing import Any

from services.router.config import POLICIES, RouterConfig
from turnout.security import ServiceSecurity, add_security_flags
from turnout.telemetry.service_setup import add_observability_flags, setup_observability

# The flags' defaults are the config's.
DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(RouterConfig)}


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    d = DEFAULTS
    parser = parser or argparse.ArgumentParser(prog="turnout router")
    parser.description = "Serve the public Inference gRPC API, routing to engines and tokenizers."
    parser.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="an engine (repeatable); a DNS name stands for every address it resolves to",
    )
    parser.add_argument(
        "--tokenizer", action="append", default=[], metavar="HOST:PORT", help="a tokenizer (repeatable)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50050)
    parser.add_argument("--log-level", default=None)
    add_observability_flags(parser, metrics_port=True)
    add_security_flags(parser)

    routing = parser.add_argument_group("routing")
    routing.add_argument("--policy", default=d["policy"], choices=POLICIES, help="default: %(default)s")
    routing.add_argument(
        "--cache-threshold",
        type=float,
        default=d["cache_threshold"],
        help="cache_aware: share of the prompt an engine's remembered prefix must cover to win (default: %(default)s)",
    )
    routing.add_argument(
        "--balance-abs-threshold",
        type=int,
        default=d["balance_abs_threshold"],
        help="cache_aware: loads are imbalanced when max - min exceeds this ... (default: %(default)s)",
    )
    routing.add_argument(
        "--balance-rel-threshold",
        type=float,
        default=d["balance_rel_threshold"],
        help="... and max exceeds min times this; then the least loaded engine wins (default: %(default)s)",
    )
    routing.add_argument(
        "--max-tree-size",
        type=int,
        default=d["max_tree_size"],
        help="cache_aware: prompt tokens remembered per engine, LRU-evicted (default: %(default)s)",
    )

    health = parser.add_argument_group("engine health")
    health.add_argument("--health-check-interval", type=float, default=d["health_check_interval_s"], metavar="SECONDS")
    health.add_argument("--health-check-timeout", type=float, default=d["health_check_timeout_s"], metavar="SECONDS")
    health.add_argument(
        "--health-failure-threshold",
        type=int,
        default=d["health_failure_threshold"],
        help="failed checks in a row that mark an engine unhealthy (default: %(default)s)",
    )
    health.add_argument(
        "--health-success-threshold",
        type=int,
        default=d["health_success_threshold"],
        help="passed checks in a row that bring it back (default: %(default)s)",
    )
    health.add_argument(
        "--load-poll-interval",
        type=float,
        default=d["load_poll_interval_s"],
        metavar="SECONDS",
        help="how often engines' GetLoad is polled; 0: never (default: %(default)s)",
    )
    health.add_argument(
        "--dns-refresh-interval",
        type=float,
        default=d["dns_refresh_interval_s"],
        metavar="SECONDS",
        help="how often --engine DNS names are resolved again (default: %(default)s)",
    )

    faults = parser.add_argument_group("faults and admission")
    faults.add_argument(
        "--max-retries",
        type=int,
        default=d["max_retries"],
        help="retries on another engine of a request that failed before its first token (default: %(default)s)",
    )
    faults.add_argument("--retry-backoff", type=float, default=d["retry_backoff_s"], metavar="SECONDS")
    faults.add_argument(
        "--circuit-breaker-failures",
        type=int,
        default=d["circuit_breaker_failures"],
        help="failed requests in a row that stop traffic to an engine; 0: off (default: %(default)s)",
    )
    faults.add_argument(
        "--circuit-breaker-cooldown", type=float, default=d["circuit_breaker_cooldown_s"], metavar="SECONDS"
    )
    faults.add_argument(
        "--tokenizer-ready-timeout",
        type=float,
        default=d["tokenizer_ready_timeout_s"],
        metavar="SECONDS",
        help="how long a request waits for a tokenizer that is down (restarting) before UNAVAILABLE; 0: no "
        "wait (default: %(default)s)",
    )
    faults.add_argument(
        "--max-concurrent-requests",
        type=int,
        default=d["max_concurrent_requests"],
        help="Generate streams open at once (default: %(default)s)",
    )
    faults.add_argument(
        "--max-queued-requests",
        type=int,
        default=d["max_queued_requests"],
        help="streams waiting for a slot; beyond: RESOURCE_EXHAUSTED (default: %(default)s)",
    )
    faults.add_argument(
        "--queue-timeout",
        type=float,
        default=d["queue_timeout_s"],
        metavar="SECONDS",
        help="longest wait for a slot before RESOURCE_EXHAUSTED (default: %(default)s)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    run(build_parser().parse_args(argv))


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    return RouterConfig(
        engines=tuple(args.engine),
        tokenizers=tuple(args.tokenizer),
        host=args.host,
        port=args.port,
        policy=args.policy,
        cache_threshold=args.cache_threshold,
        balance_abs_threshold=args.balance_abs_threshold,
        balance_rel_threshold=args.balance_rel_threshold,
        max_tree_size=args.max_tree_size,
        health_check_interval_s=args.health_check_interval,
        health_check_timeout_s=args.health_check_timeout,
        health_failure_threshold=args.health_failure_threshold,
        health_success_threshold=args.health_success_threshold,
        load_poll_interval_s=args.load_poll_interval,
        dns_refresh_interval_s=args.dns_refresh_interval,
        max_retries=args.max_retries,
        retry_backoff_s=args.retry_backoff,
        circuit_breaker_failures=args.circuit_breaker_failures,
        circuit_breaker_cooldown_s=args.circuit_breaker_cooldown,
        tokenizer_ready_timeout_s=args.tokenizer_ready_timeout,
        max_concurrent_requests=args.max_concurrent_requests,
        max_queued_requests=args.max_queued_requests,
        queue_timeout_s=args.queue_timeout,
        metrics_port=args.metrics_port,
        security=ServiceSecurity.from_args(args),
    )


def run(args: argparse.Namespace) -> None:
    setup_observability("router", args)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        raise SystemExit(f"turnout router: {exc}") from None
    asyncio.run(_serve(config))


async def _serve(config: RouterConfig) -> None:
    from services.router.runtime import RouterRuntime
    from turnout.grpc_server import serve

    router = RouterRuntime(config)
    await router.start()
    await serve(config.address, router.services(), service="router", on_stop=router.close, security=config.security)


if __name__ == "__main__":
    main()
