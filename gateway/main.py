"""`turnout gateway`: serve the HTTP API in front of a router until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import logging

from gateway.config import GatewayConfig
from turnout.telemetry.service_setup import add_observability_flags, setup_observability

log = logging.getLogger(__name__)

# Requests in flight get this long to finish on SIGTERM before they are cut.
GRACEFUL_SHUTDOWN_S = 5


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="turnout gateway")
    parser.description = "OpenAI-compatible and SGLang-native HTTP API in front of a Turnout router."
    parser.add_argument("--router", required=True, metavar="ADDR", help="router gRPC address, e.g. 127.0.0.1:50051")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="deadline of each call to the router; past it the client gets 504 (default: none)",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="log level (default: $TURNOUT_LOG_LEVEL, else INFO)",
    )
    add_observability_flags(parser, metrics_port=False)
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


def run(args: argparse.Namespace) -> None:
    # Imported here so other `turnout` commands (and --help) stay fast.
    import uvicorn

    from gateway.app import create_app

    setup_observability("gateway", args)
    try:
        config = GatewayConfig(
            router_address=args.router, host=args.host, port=args.port, request_timeout_s=args.request_timeout
        )
    except ValueError as exc:
        raise SystemExit(f"turnout gateway: {exc}") from None
    log.info("starting", extra={"router": config.router_address, "host": config.host, "port": config.port})
    # log_config=None keeps our JSON logging; uvicorn handles SIGTERM/SIGINT
    # itself: stop accepting, drain in-flight requests, run the lifespan shutdown.
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            host=config.host,
            port=config.port,
            log_config=None,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        )
    )
    # uvicorn shuts down gracefully, then re-raises Ctrl-C only to exit: no traceback for that.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()


if __name__ == "__main__":
    main()
