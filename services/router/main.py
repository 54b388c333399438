"""`turnout router`: the public Inference gRPC service in front of engines and tokenizers."""

from __future__ import annotations

import argparse
import asyncio

from services.router.config import RouterConfig
from turnout.flag_parser import FlagParser
from turnout.flags import add_flags, config_kwargs
from turnout.security import ServiceSecurity, add_security_flags
from turnout.telemetry.service_setup import add_observability_flags, setup_observability


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or FlagParser(prog="turnout router")
    parser.description = "Serve the public Inference gRPC API, routing to engines and tokenizers."
    add_flags(parser, RouterConfig)
    add_observability_flags(parser, metrics_port=True)
    add_security_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    run(build_parser().parse_args(argv))


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    return RouterConfig(
        **config_kwargs(RouterConfig, args), metrics_port=args.metrics_port, security=ServiceSecurity.from_args(args)
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
    await serve(
        config.address,
        router.services(),
        service="router",
        on_stop=router.close,
        on_drain=router.drain,
        security=config.security,
    )


if __name__ == "__main__":
    main()
