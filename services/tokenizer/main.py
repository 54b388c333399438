"""`turnout tokenizer`: serve a model's tokenizer over the Tokenizer gRPC service."""

from __future__ import annotations

import argparse
import asyncio

from services.tokenizer.config import TokenizerConfig, TokenizerLimits
from turnout.flag_parser import FlagParser
from turnout.flags import add_flags, config_kwargs
from turnout.model_reference import resolve as resolve_model
from turnout.security import ServiceSecurity, add_security_flags
from turnout.telemetry.service_setup import add_observability_flags, setup_observability


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or FlagParser(prog="turnout tokenizer")
    parser.description = "Serve a tokenizer: encode, chat templates, streaming detokenization, stop strings."
    add_flags(parser, TokenizerConfig)
    add_flags(parser.add_argument_group("limits per request"), TokenizerLimits)
    add_observability_flags(parser, metrics_port=True)
    add_security_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    run(build_parser().parse_args(argv))


def config_from_args(args: argparse.Namespace) -> TokenizerConfig:
    """The config the flags describe; ValueError names a bad one."""
    kwargs = config_kwargs(TokenizerConfig, args)
    # Folders as they are; a GGUF file or a Hugging Face id (as `turnout serve` takes them) resolved here.
    separate = kwargs["tokenizer"] is not None
    kwargs["model"] = resolve_model(kwargs["model"], kind="model" if separate else "tokenizer").folder
    if separate:
        kwargs["tokenizer"] = resolve_model(kwargs["tokenizer"], kind="tokenizer").folder
    return TokenizerConfig(
        **kwargs,
        limits=TokenizerLimits(**config_kwargs(TokenizerLimits, args)),
        metrics_port=args.metrics_port,
        security=ServiceSecurity.from_args(args),
    )


def run(args: argparse.Namespace) -> None:
    setup_observability("tokenizer", args)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        raise SystemExit(f"turnout tokenizer: {exc}") from None
    asyncio.run(_serve(config))


async def _serve(config: TokenizerConfig) -> None:
    from services.tokenizer.without_torch import keep_torch_out

    keep_torch_out()  # before anything imports transformers
    from services.tokenizer.service import TokenizerServicer
    from services.tokenizer.text_tokenizer import TextTokenizer
    from turnout.grpc_server import MetricsEndpoint, ServiceSpec, serve
    from turnout.telemetry.gc_metrics import register_gc_pauses
    from turnout.telemetry.metrics_service import RegistryMetrics, metrics_spec
    from turnout.telemetry.rpc_metrics import RpcMetrics
    from turnout.v1 import tokenizer_pb2, tokenizer_pb2_grpc

    metrics = RpcMetrics("tokenizer")
    register_gc_pauses(metrics.registry, "tokenizer")
    servicer = TokenizerServicer(
        TextTokenizer(config.tokenizer_folder, config.chat_template),
        reasoning_parser=config.reasoning_parser,
        tool_call_parser=config.tool_call_parser,
        limits=config.limits,
        content_format=config.chat_template_content_format,
        carried_metrics=metrics,
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
            on_drain=servicer.drain,
            metrics=endpoint,
            security=config.security,
        )
    finally:
        await servicer.close()


if __name__ == "__main__":
    main()
