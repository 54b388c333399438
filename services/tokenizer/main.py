"""`turnout tokenizer`: serve a model's tokenizer over the Tokenizer gRPC service."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from services.tokenizer.config import TokenizerConfig, add_limit_flags, limits_from_args
from services.tokenizer.reasoning import REASONING_PARSERS
from services.tokenizer.tool_parsers import TOOL_PARSERS
from turnout.security import ServiceSecurity, add_security_flags
from turnout.telemetry.service_setup import add_observability_flags, setup_observability


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="turnout tokenizer")
    parser.description = "Serve a tokenizer: encode, chat templates, streaming detokenization, stop strings."
    parser.add_argument("--model", type=Path, required=True, help="Hugging Face model (or tokenizer) folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50052)
    parser.add_argument("--chat-template", default=None, help="Jinja chat template (file path or text)")
    parser.add_argument(
        "--reasoning-parser",
        default=None,
        choices=sorted(REASONING_PARSERS),
        help="split <think> blocks into reasoning_text for requests with separate_reasoning (default: none)",
    )
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        choices=sorted(TOOL_PARSERS),
        help="read tool calls from the output for tool_choice 'auto' (default: none; such requests are refused)",
    )
    parser.add_argument("--log-level", default=None)
    add_limit_flags(parser.add_argument_group("limits per request"))
    add_observability_flags(parser, metrics_port=True)
    add_security_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    run(build_parser().parse_args(argv))


def run(args: argparse.Namespace) -> None:
    setup_observability("tokenizer", args)
    try:
        config = TokenizerConfig(
            model=args.model,
            host=args.host,
            port=args.port,
            chat_template=args.chat_template,
            reasoning_parser=args.reasoning_parser,
            tool_call_parser=args.tool_call_parser,
            metrics_port=args.metrics_port,
            security=ServiceSecurity.from_args(args),
            limits=limits_from_args(args),
        )
    except ValueError as exc:
        raise SystemExit(f"turnout tokenizer: {exc}") from None
    asyncio.run(_serve(config))


async def _serve(config: TokenizerConfig) -> None:
    from services.tokenizer.service import TokenizerServicer
    from services.tokenizer.text_tokenizer import TextTokenizer
    from turnout.grpc_server import MetricsEndpoint, ServiceSpec, serve
    from turnout.telemetry.metrics_service import RegistryMetrics, metrics_spec
    from turnout.telemetry.rpc_metrics import RpcMetrics
    from turnout.v1 import tokenizer_pb2, tokenizer_pb2_grpc

    metrics = RpcMetrics("tokenizer")
    servicer = TokenizerServicer(
        TextTokenizer(config.model, config.chat_template),
        reasoning_parser=config.reasoning_parser,
        tool_call_parser=config.tool_call_parser,
        limits=config.limits,
    )
    spec = ServiceSpec(
        name=tokenizer_pb2.DESCRIPTOR.services_by_name["Tokenizer"].full_name,
        add=lambda server: tokenizer_pb2_grpc.add_TokenizerServicer_to_server(servicer, server),
    )
    endpoint = (
        None if config.metrics_port is None else MetricsEndpoint(metrics.registry, config.host, config.metrics_port)
    )
    await servicer.start()
    try:
        await serve(
            config.address,
            [spec, metrics_spec(RegistryMetrics(metrics.registry))],
            service="tokenizer",
            interceptors=[metrics],
            metrics=endpoint,
            security=config.security,
        )
    finally:
        await servicer.close()


if __name__ == "__main__":
    main()
