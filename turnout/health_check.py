"""`turnout health ADDR`: exit 0 when the gRPC service at ADDR reports SERVING (for container probes)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from turnout.grpc_server import wait_healthy
from turnout.security import ClientCredentials, tls_from_args


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="turnout health")
    parser.description = "Check the standard grpc.health.v1 service of a Turnout service."
    parser.add_argument("address", metavar="HOST:PORT")
    parser.add_argument("--service", default="", help="service name to check (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to keep trying")
    # The health service needs no credential; a TLS service needs TLS (docs/security.md).
    parser.add_argument("--ssl-ca-certs", type=Path, default=None, help="CA of a TLS service")
    parser.add_argument("--ssl-certfile", type=Path, default=None, help="client certificate (mutual TLS)")
    parser.add_argument("--ssl-keyfile", type=Path, default=None, help="its key")
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        credentials = ClientCredentials(tls=tls_from_args(args))
    except ValueError as exc:
        print(f"turnout health: {exc}")
        return 2
    try:
        asyncio.run(wait_healthy(args.address, args.timeout, args.service, credentials))
    except TimeoutError as exc:
        print(f"unhealthy: {exc}")
        return 1
    print("SERVING")
    return 0
