"""`turnout gateway`: serve the HTTP API in front of a router until SIGTERM or Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal

from gateway.config import DEFAULT_MAX_CLIENT_BATCH_SIZE, DEFAULT_MAX_REQUEST_BYTES, GatewayConfig
from turnout.security import ServiceSecurity, add_security_flags
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
        "--router-ready-timeout",
        type=float,
        default=GatewayConfig.router_ready_timeout_s,
        metavar="SECONDS",
        help="how long a request waits for a router that is down (restarting) before 503; 0: no wait "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="names clients may use for the router's default model; responses report the first (default: the "
        "router's names)",
    )
    parser.add_argument(
        "--allowed-origins", type=_string_list, default=["*"], help="CORS origins, a JSON list (default: %(default)s)"
    )
    parser.add_argument(
        "--allowed-methods", type=_string_list, default=["*"], help="CORS methods, a JSON list (default: %(default)s)"
    )
    parser.add_argument(
        "--allowed-headers", type=_string_list, default=["*"], help="CORS headers, a JSON list (default: %(default)s)"
    )
    parser.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    parser.add_argument(
        "--root-path", default="", help="path prefix when served behind a reverse proxy, e.g. /llm (default: none)"
    )
    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        metavar="N",
        help="larger request bodies are answered 413 (default: %(default)s)",
    )
    parser.add_argument(
        "--max-client-batch-size",
        type=int,
        default=DEFAULT_MAX_CLIENT_BATCH_SIZE,
        metavar="N",
        help="most prompts in one request's batch; a larger batch is answered 400 (default: %(default)s)",
    )
    parser.add_argument(
        "--log-level",
        default=None,
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
        help="log level (default: $TURNOUT_LOG_LEVEL, else INFO)",
    )
    add_observability_flags(parser, metrics_port=False)
    add_security_flags(parser)
    return parser


def _string_list(value: str) -> list[str]:
    """A JSON list of strings, as vLLM takes its CORS flags (a comma-separated list works too)."""
    if not value.lstrip().startswith("["):
        return [part.strip() for part in value.split(",") if part.strip()]
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not a JSON list: {exc}") from None
    if not isinstance(parsed, list) or not all(isinstance(item, str) for item in parsed):
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings, got {value}")
    return parsed


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    """The config the flags describe; ValueError names a bad one."""
    return GatewayConfig(
        router_address=args.router,
        host=args.host,
        port=args.port,
        request_timeout_s=args.request_timeout,
        router_ready_timeout_s=args.router_ready_timeout,
        served_model_names=tuple(args.served_model_name or ()),
        allowed_origins=tuple(args.allowed_origins),
        allowed_methods=tuple(args.allowed_methods),
        allowed_headers=tuple(args.allowed_headers),
        allow_credentials=args.allow_credentials,
        root_path=args.root_path,
        max_request_bytes=args.max_request_bytes,
        max_client_batch_size=args.max_client_batch_size,
        security=ServiceSecurity.from_args(args),
    )


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
        config = config_from_args(args)
    except ValueError as exc:
        raise SystemExit(f"turnout gateway: {exc}") from None
    log.info("starting", extra={"router": config.router_address, "host": config.host, "port": config.port})
    # log_config=None keeps our JSON logging; uvicorn handles SIGTERM/SIGINT
    # itself: stop accepting, drain in-flight requests, run the lifespan shutdown.
    tls = config.security.tls
    https = tls is not None and tls.serves_tls
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config),
            host=config.host,
            port=config.port,
            log_config=None,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            # HTTPS with the service's certificate (clients are not asked for one).
            ssl_certfile=str(tls.certfile) if https and tls is not None else None,
            ssl_keyfile=str(tls.keyfile) if https and tls is not None else None,
        )
    )
    # uvicorn shuts down gracefully, then raises the signal it handled again to end the process the
    # way that signal would. Handled here like uvicorn handles it, SIGTERM ends with exit status 0
    # instead of death by signal (and one that comes before uvicorn listens still stops it); Ctrl-C
    # is re-raised as KeyboardInterrupt: no traceback for that.
    signal.signal(signal.SIGTERM, server.handle_exit)
    with contextlib.suppress(KeyboardInterrupt):
        server.run()


if __name__ == "__main__":
    main()
