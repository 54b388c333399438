"""`turnout health ADDR`: exit 0 when the gRPC service at ADDR reports SERVING (for container probes)."""

from __future__ import annotations

import argparse
import asyncio

from turnout.grpc_server import wait_healthy


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="turnout health")
    parser.description = "Check the standard grpc.health.v1 service of a Turnout service."
    parser.add_argument("address", metavar="HOST:PORT")
    parser.add_argument("--service", default="", help="service name to check (default: the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to keep trying")
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        asyncio.run(wait_healthy(args.address, args.timeout, args.service))
    except TimeoutError as exc:
        print(f"unhealthy: {exc}")
        return 1
    print("SERVING")
    return 0
