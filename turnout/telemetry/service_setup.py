"""The observability flags every service shares, and setting them up at process start."""

from __future__ import annotations

import argparse

from turnout.logs import LOG_FORMATS, LOG_LEVELS, setup_logging
from turnout.telemetry.tracing import setup_tracing


def add_observability_flags(parser: argparse.ArgumentParser, *, metrics_port: bool) -> None:
    """`--log-level`, `--log-format`, and `--metrics-port` for the gRPC services (the gateway serves
    /metrics on its HTTP port)."""
    group = parser.add_argument_group("observability (tracing: set OTEL_TRACES_EXPORTER, see docs/observability.md)")
    group.add_argument(
        "--log-level",
        default=None,
        type=str.upper,
        choices=LOG_LEVELS,
        help="log level (default: $TURNOUT_LOG_LEVEL, else INFO)",
    )
    group.add_argument(
        "--log-format",
        default=None,
        type=str.lower,
        choices=LOG_FORMATS,
        help="default: $TURNOUT_LOG_FORMAT, else json",
    )
    if metrics_port:
        group.add_argument(
            "--metrics-port",
            type=int,
            default=None,
            help="serve Prometheus /metrics over HTTP on this port (default: off)",
        )


def setup_observability(service: str, args: argparse.Namespace) -> None:
    """Logging in the chosen format, then tracing if the OTEL_* environment asks for it."""
    setup_logging(service, args.log_level, args.log_format)
    setup_tracing(service)
