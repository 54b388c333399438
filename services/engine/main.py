"""`turnout engine`: serve a model over the Engine gRPC service."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import threading

from services.engine.config import EngineConfig, kv_cache_memory_from_env
from turnout.cpu_cores import bind_compute_thread, bind_process_outside, show_cpu_list
from turnout.flag_parser import FlagParser
from turnout.flags import add_flags, config_kwargs
from turnout.model_reference import resolve as resolve_model
from turnout.security import ServiceSecurity, add_security_flags
from turnout.telemetry.service_setup import add_observability_flags, setup_observability

# After a tensor-parallel rank is lost, how long the graceful stop may take before the process exits anyway
# (a collective on NCCL can wait forever for the dead rank).
LOST_RANK_EXIT_S = 30.0

log = logging.getLogger(__name__)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or FlagParser(prog="turnout engine")
    parser.description = "Serve a model over the Engine gRPC service (token ids in, token ids out)."
    add_flags(parser, EngineConfig)
    add_observability_flags(parser, metrics_port=True)
    add_security_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    run(args)


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The config the flags describe; ValueError names a bad one."""
    kwargs = config_kwargs(EngineConfig, args)
    # A folder as it is; a GGUF file or a Hugging Face id (as `turnout serve` takes them) resolved here.
    model = resolve_model(kwargs["model"])
    kwargs["model"] = model.folder
    kwargs["served_model_name"] = kwargs["served_model_name"] or model.name
    kwargs["kv_cache_memory_gib"] = kv_cache_memory_from_env(args.kv_cache_memory_gib, os.environ)
    return EngineConfig(**kwargs, metrics_port=args.metrics_port, security=ServiceSecurity.from_args(args))


def run(args: argparse.Namespace) -> None:
    setup_observability("engine", args)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        raise SystemExit(f"turnout engine: {exc}") from None
    asyncio.run(_serve(config))


async def _serve(config: EngineConfig) -> None:
    # Heavy imports (torch, transformers) only once we really serve, so --help is instant.
    from services.engine.engine_loop import EngineLoop
    from services.engine.llm_engine import LLMEngine
    from services.engine.service import EngineServicer
    from turnout.grpc_server import MetricsEndpoint, ServiceSpec, serve
    from turnout.telemetry.engine_metrics import EngineMetrics
    from turnout.telemetry.gc_metrics import register_gc_pauses
    from turnout.telemetry.metrics_service import RegistryMetrics, metrics_spec
    from turnout.v1 import engine_pb2, engine_pb2_grpc

    metrics = EngineMetrics(model_name=config.model_name)
    register_gc_pauses(metrics.registry, "engine")
    others: tuple[int, ...] = ()
    if config.cpu_cores:
        try:
            # Before the step thread starts: it and the gRPC threads inherit the process's mask.
            others = bind_process_outside(config.cpu_cores)
        except ValueError as exc:
            raise SystemExit(f"turnout engine: {exc}") from None

    def make_engine() -> LLMEngine:
        if config.cpu_cores:
            threads = bind_compute_thread(config.cpu_cores)
            log.info(
                "compute threads bound",
                extra={
                    "cpu_cores": show_cpu_list(config.cpu_cores),
                    "omp_threads": threads,
                    "other_threads_on": show_cpu_list(others),
                },
            )
        return LLMEngine(config)

    try:
        # Built on the thread that steps it: one OpenMP team in the process (engine_loop.py).
        engine = await asyncio.wrap_future(EngineLoop.build(make_engine, config.max_waiting_requests, metrics))
    except (ValueError, OSError) as exc:
        raise SystemExit(f"turnout engine: cannot load {config.model}: {exc}") from None
    ranks = engine.engine.ranks
    if ranks is not None:
        ranks.on_lost(_stop_serving)
    servicer = EngineServicer(engine.engine.loaded, engine, config)
    spec = ServiceSpec(
        name=engine_pb2.DESCRIPTOR.services_by_name["Engine"].full_name,
        add=lambda server: engine_pb2_grpc.add_EngineServicer_to_server(servicer, server),
    )

    async def stop_engine() -> None:
        await asyncio.to_thread(engine.shutdown)

    endpoint = (
        None if config.metrics_port is None else MetricsEndpoint(metrics.registry, config.host, config.metrics_port)
    )
    # The router asks for the page over gRPC (Metrics.Scrape) for the gateway's /metrics.
    specs = [spec, metrics_spec(RegistryMetrics(metrics.registry))]
    await serve(
        config.address,
        specs,
        service="engine",
        on_stop=stop_engine,
        on_drain=servicer.drain,
        metrics=endpoint,
        security=config.security,
    )
    if ranks is not None and ranks.lost is not None:
        raise SystemExit(f"turnout engine: {ranks.lost}")


def _stop_serving(reason: str) -> None:
    """A tensor-parallel rank is gone: no step can run any more. Stop as on SIGTERM (health NOT_SERVING,
    so the router drops this engine; open calls end UNAVAILABLE), then exit non-zero (above), so a
    supervisor restarts the engine with all its ranks; if the stop hangs, exit anyway."""
    del reason  # logged by Ranks
    os.kill(os.getpid(), signal.SIGTERM)
    timer = threading.Timer(LOST_RANK_EXIT_S, os._exit, args=(1,))
    timer.daemon = True
    timer.start()


if __name__ == "__main__":
    main()
