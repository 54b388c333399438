"""`turnout engine`: serve a model over the Engine gRPC service."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import threading
from pathlib import Path

from services.engine.config import (
    KV_CACHE_SPACE_ENV,
    EngineConfig,
    add_limit_flags,
    kv_cache_memory_from_env,
    parse_lora_module,
    request_limit_fields,
)
from turnout.security import ServiceSecurity, add_security_flags
from turnout.telemetry.service_setup import add_observability_flags, setup_observability

# After a tensor-parallel rank is lost, how long the graceful stop may take before the process exits anyway
# (a collective on NCCL can wait forever for the dead rank).
LOST_RANK_EXIT_S = 30.0


def _lora_module(text: str) -> tuple[str, Path]:
    try:
        return parse_lora_module(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="turnout engine")
    parser.description = "Serve a model over the Engine gRPC service (token ids in, token ids out)."
    parser.add_argument("--model", type=Path, required=True, help="Hugging Face model folder")
    parser.add_argument("--served-model-name", default=None, help="name clients use (default: the folder's name)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50051)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--dtype", default="auto", help="auto (float32 on CPU, bfloat16 on CUDA), float32, ...")
    parser.add_argument(
        "--attention-backend",
        default="auto",
        help="paged attention: auto (triton on CUDA; on CPU the C++ kernel, else torch), torch, triton, or cpu",
    )
    parser.add_argument(
        "--sampling-backend",
        default="auto",
        help="the sampler's draw for unseeded batches: auto (triton on CUDA, torch on CPU), torch, or triton",
    )
    parser.add_argument("--max-model-len", type=int, default=None, help="cap on prompt + output tokens")
    parser.add_argument("--max-waiting-requests", type=int, default=1024, help="queue bound before 429s")
    kv = parser.add_argument_group("KV cache")
    kv.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    kv.add_argument("--num-kv-blocks", type=int, default=None, help="KV pool size in blocks (overrides memory)")
    kv.add_argument(
        "--kv-cache-memory",
        type=float,
        default=None,
        metavar="GIB",
        help=f"KV pool size in GiB (or {KV_CACHE_SPACE_ENV}; default: on CPU 4, at most a tenth of total RAM; "
        "on CUDA what --gpu-memory-utilization leaves)",
    )
    kv.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=0.9,
        help="CUDA: share of the device's total memory this engine may use, its KV pool included; the pool "
        "gets what a profiling pass leaves of it (default: 0.9; two engines on one GPU: 0.45 each)",
    )
    kv.add_argument("--no-prefix-caching", action="store_true", help="turn prefix caching off")
    graphs = parser.add_argument_group("CUDA graphs")
    graphs.add_argument(
        "--disable-cuda-graph", action="store_true", help="run decode steps eagerly instead of replaying CUDA graphs"
    )
    graphs.add_argument(
        "--cuda-graph-max-bs",
        type=int,
        default=None,
        help="largest decode batch replayed from a CUDA graph (default: --max-running-requests, at most 256)",
    )
    graphs.add_argument(
        "--cuda-graph-max-seq-len",
        type=int,
        default=8192,
        help="longest sequence a replayed decode step may hold; batches with longer ones run eagerly",
    )
    parallel = parser.add_argument_group("tensor parallelism")
    parallel.add_argument(
        "--tensor-parallel-size",
        "--tp-size",
        dest="tensor_parallel_size",
        type=int,
        default=1,
        metavar="N",
        help="split the model over N ranks (processes this engine starts; on CUDA one GPU each), "
        "rank 0 scheduling for all (vLLM --tensor-parallel-size, SGLang --tp-size; default: 1)",
    )
    parallel.add_argument(
        "--distributed-backend",
        default="auto",
        help="torch.distributed backend of the ranks: auto (nccl on CUDA, gloo on CPU), gloo or nccl",
    )
    lora = parser.add_argument_group("LoRA adapters (vLLM's flags; docs/lora.md)")
    lora.add_argument("--enable-lora", action="store_true", help="serve LoRA adapters of the model")
    lora.add_argument(
        "--lora-modules",
        nargs="+",
        type=_lora_module,
        default=[],
        metavar="NAME=PATH",
        help="adapters (PEFT folders) loaded at start, served as `model` NAME and SGLang `lora_path` NAME",
    )
    lora.add_argument(
        "--max-loras", type=int, default=1, help="adapters on the device at once: the most one step can mix"
    )
    lora.add_argument("--max-lora-rank", type=int, default=16, help="highest adapter rank accepted")
    sched = parser.add_argument_group("scheduler")
    sched.add_argument("--max-num-batched-tokens", type=int, default=2048, help="tokens computed per step")
    sched.add_argument("--max-running-requests", type=int, default=256)
    sched.add_argument("--scheduling-policy", default="fcfs", help="fcfs, or priority (request field `priority`)")
    overlap = sched.add_mutually_exclusive_group()
    overlap.add_argument(
        "--disable-overlap-schedule",
        dest="overlap_schedule",
        action="store_false",
        default=None,
        help="postprocess each step before scheduling the next (default: overlapped with the device on CUDA)",
    )
    overlap.add_argument(
        "--enable-overlap-schedule",
        dest="overlap_schedule",
        action="store_true",
        default=None,
        help="postprocess each step while the device runs the next, even on CPU",
    )
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument(
        "--sampling-defaults",
        default="model",
        help="model: unset parameters take generation_config.json's values; openai: the documented defaults",
    )
    sampling.add_argument("--max-logprobs", type=int, default=20, help="most alternatives per position a request gets")
    sampling.add_argument(
        "--logprobs-mode",
        default="processed",
        help="processed: log-probs of the distribution sampled from (after penalties, temperature); raw: of logits",
    )
    outputs = parser.add_argument_group("structured outputs and logits processors")
    outputs.add_argument(
        "--grammar-max-whitespace",
        type=int,
        default=4,
        help="longest whitespace run JSON constraints allow between tokens (requests may ask for none)",
    )
    outputs.add_argument("--think-start-token", default="<think>", help="the model's thinking start tag")
    outputs.add_argument("--think-end-token", default="</think>", help="the model's thinking end tag")
    outputs.add_argument(
        "--enable-custom-logit-processor",
        action="store_true",
        help="accept logits processors serialized by clients (runs their code: trusted clients only)",
    )
    add_limit_flags(parser)
    parser.add_argument("--log-level", default=None)
    add_observability_flags(parser, metrics_port=True)
    add_security_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    run(args)


def run(args: argparse.Namespace) -> None:
    setup_observability("engine", args)
    try:
        config = EngineConfig(
            model=args.model,
            served_model_name=args.served_model_name,
            host=args.host,
            port=args.port,
            device=args.device,
            dtype=args.dtype,
            attention_backend=args.attention_backend,
            sampling_backend=args.sampling_backend,
            max_model_len=args.max_model_len,
            max_waiting_requests=args.max_waiting_requests,
            block_size=args.block_size,
            num_kv_blocks=args.num_kv_blocks,
            kv_cache_memory_gib=kv_cache_memory_from_env(args.kv_cache_memory, os.environ),
            gpu_memory_utilization=args.gpu_memory_utilization,
            enable_prefix_caching=not args.no_prefix_caching,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_running_requests=args.max_running_requests,
            scheduling_policy=args.scheduling_policy,
            overlap_schedule=args.overlap_schedule,
            sampling_defaults=args.sampling_defaults,
            max_logprobs=args.max_logprobs,
            logprobs_mode=args.logprobs_mode,
            grammar_max_whitespace=args.grammar_max_whitespace,
            think_start_token=args.think_start_token,
            think_end_token=args.think_end_token,
            enable_custom_logit_processor=args.enable_custom_logit_processor,
            metrics_port=args.metrics_port,
            security=ServiceSecurity.from_args(args),
            disable_cuda_graph=args.disable_cuda_graph,
            cuda_graph_max_bs=args.cuda_graph_max_bs,
            cuda_graph_max_seq_len=args.cuda_graph_max_seq_len,
            tensor_parallel_size=args.tensor_parallel_size,
            distributed_backend=args.distributed_backend,
            enable_lora=args.enable_lora,
            lora_modules=tuple(args.lora_modules),
            max_loras=args.max_loras,
            max_lora_rank=args.max_lora_rank,
            **{limit.name: getattr(args, limit.name) for limit in request_limit_fields()},
        )
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
    from turnout.telemetry.metrics_service import RegistryMetrics, metrics_spec
    from turnout.v1 import engine_pb2, engine_pb2_grpc

    metrics = EngineMetrics(model_name=config.model_name)
    try:
        # Built on the thread that steps it: one OpenMP team in the process (engine_loop.py).
        engine = await asyncio.wrap_future(
            EngineLoop.build(lambda: LLMEngine(config), config.max_waiting_requests, metrics)
        )
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
        config.address, specs, service="engine", on_stop=stop_engine, metrics=endpoint, security=config.security
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
