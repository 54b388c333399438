"""`turnout gateway`: serve the HTTP API in front of a router until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket

from gateway.config import GatewayConfig
from turnout.flag_parser import FlagParser
from turnout.flags import add_flags, config_kwargs
from turnout.gateway_replicas import SHARED_SOCKET_ENV
from turnout.gc_heap import freeze_startup_heap
from turnout.security import ServiceSecurity, add_security_flags
from turnout.telemetry.service_setup import add_observability_flags, setup_observability

log = logging.getLogger(__name__)

# Requests in flight get this long to finish on SIGTERM before they are cut.
GRACEFUL_SHUTDOWN_S = 5


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or FlagParser(prog="turnout gateway")
    parser.description = "OpenAI-compatible and SGLang-native HTTP API in front of a Turnout router."
    add_flags(parser, GatewayConfig)
    add_observability_flags(parser, metrics_port=False)
    add_security_flags(parser)
    return parser


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """The config the flags describe; ValueError names a bad one."""
    return GatewayConfig(**config_kwargs(GatewayConfig, args), security=ServiceSecurity.from_args(args))


def apply_log_settings(config: GatewayConfig) -> None:
    """uvicorn's loggers at --uvicorn-log-level; its access log (a line per request) only with
    --enable-log-requests (logs.py keeps it at warning otherwise)."""
    level = logging.getLevelName(config.uvicorn_log_level.upper())
    # uvicorn's TRACE (5) has no name in logging unless uvicorn registered it.
    logging.getLogger("uvicorn").setLevel(level if isinstance(level, int) else 5)
    logging.getLogger("uvicorn.access").setLevel(logging.INFO if config.enable_log_requests else logging.WARNING)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


def run(args: argparse.Namespace) -> None:
    # Imported here so other `turnout` commands (and --help) stay fast.
    import uvicorn

    from gateway.app import create_app
    from gateway.uvicorn_server import GatewayServer

    setup_observability("gateway", args)
    try:
        config = config_from_args(args)
        app = create_app(config)
    except ValueError as exc:
        raise SystemExit(f"turnout gateway: {exc}") from None
    apply_log_settings(config)
    log.info("starting", extra={"router": config.router_address, "host": config.host, "port": config.port})
    # log_config=None keeps our JSON logging; uvicorn handles SIGTERM/SIGINT
    # itself: stop accepting, drain in-flight requests, run the lifespan shutdown.
    tls = config.security.tls
    https = tls is not None and tls.serves_tls
    uvicorn_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_config=None,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        # HTTPS with the service's certificate (clients are not asked for one).
        ssl_certfile=str(tls.certfile) if https and tls is not None else None,
        ssl_keyfile=str(tls.keyfile) if https and tls is not None else None,
    )
    server = GatewayServer(uvicorn_config)
    sockets: list[socket.socket] | None = None
    shared = os.environ.pop(SHARED_SOCKET_ENV, None)
    if shared is not None:
        # One of several gateways (turnout/gateway_replicas.py): clients reach it on the public socket
        # the launcher bound and shares with every gateway; --host/--port is this process's own, where
        # the launcher probes its health.
        sockets = [uvicorn_config.bind_socket(), socket.socket(fileno=int(shared))]
    # uvicorn shuts down gracefully, then raises the signal it handled again to end the process the
    # way that signal would. Handled here like uvicorn handles it, SIGTERM ends with exit status 0
    # instead of death by signal (and one that comes before uvicorn listens still stops it); Ctrl-C
    # is re-raised as KeyboardInterrupt: no traceback for that.
    signal.signal(signal.SIGTERM, server.handle_exit)
    freeze_startup_heap()  # the app is built: what is alive now lives as long as the process
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=sockets)


if __name__ == "__main__":
    main()
