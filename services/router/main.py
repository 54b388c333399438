"""`turnout router`: the public Inference gRPC service in front of engines and tokenizers."""

from __future__ import annotations

import argparse
import asyncio

from services.router.config import RouterConfig
from turnout.logs import setup_logging


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="turnout router")
    parser.description = "Serve the public Inference gRPC API, routing to engines and tokenizers."
    parser.add_argument("--engine", action="append", default=[], metavar="HOST:PORT", help="an engine (repeatable)")
    parser.add_argument(
        "--tokenizer", action="append", default=[], metavar="HOST:PORT", help="a tokenizer (repeatable)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50050)
    parser.add_argument("--log-level", default=None)
    return parser


def main(argv: list[str] | None = None) -> None:
    run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> None:
    setup_logging("router", args.log_level)
    try:
        config = RouterConfig(
            engines=tuple(args.engine), tokenizers=tuple(args.tokenizer), host=args.host, port=args.port
        )
    except ValueError as exc:
        raise SystemExit(f"turnout router: {exc}") from None
    asyncio.run(_serve(config))


async def _serve(config: RouterConfig) -> None:
    from services.router.engine_pool import EnginePool
    from services.router.service import InferenceServicer
    from services.router.tokenizer_pool import TokenizerPool
    from turnout.grpc_server import ServiceSpec, serve
    from turnout.v1 import inference_pb2, inference_pb2_grpc

    engines = EnginePool(config.engines, config.discovery_interval_s)
    tokenizers = TokenizerPool(config.tokenizers)
    engines.start()
    servicer = InferenceServicer(engines, tokenizers)
    spec = ServiceSpec(
        name=inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name,
        add=lambda server: inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server),
    )

    async def close_pools() -> None:
        await engines.close()
        await tokenizers.close()

    await serve(config.address, [spec], on_stop=close_pools)


if __name__ == "__main__":
    main()
