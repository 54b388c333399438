"""`turnout serve`: the whole stack on one machine as child processes on loopback.

`--engines N` starts N engine replicas behind the router (data parallelism):
on a machine with several GPUs each replica sees one (`CUDA_VISIBLE_DEVICES`),
round-robin over the GPUs when there are more replicas than GPUs; on the CPU the
replicas split the cores between their thread pools (`OMP_NUM_THREADS`).

`--metrics` gives every gRPC service a free Prometheus port (printed once the stack is up; the
gateway always serves `/metrics` on its HTTP port), and the launcher one for its restart
counter. `--log-format` is passed to every child; the OTEL_* environment (tracing) reaches them
as it is.

Start order: engines and tokenizer, then the router, then the gateway; each is
waited for until healthy (a child that dies during start-up fails the start).
Once serving, a child that dies is restarted with backoff while the others keep
serving; a crash loop stops the stack (supervisor.py). Stop order is the reverse:
on SIGTERM/SIGINT every child gets SIGTERM, then SIGKILL after a grace period;
children also get SIGTERM from the kernel if the launcher itself dies.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry

from services.engine.config import POLICIES as SCHEDULING_POLICIES
from services.engine.config import add_limit_flags as add_engine_limit_flags
from services.engine.config import limit_flag, request_limit_fields
from services.router.config import POLICIES
from services.tokenizer.config import add_limit_flags as add_tokenizer_limit_flags
from services.tokenizer.config import limit_args
from services.tokenizer.reasoning import REASONING_PARSERS
from services.tokenizer.tool_parsers import TOOL_PARSERS
from turnout.child_processes import Child, Stack, free_port, grpc_healthy, http_healthy
from turnout.logs import LOG_FORMATS
from turnout.security import add_security_flags, launcher_credentials, stack_environment, stack_flags
from turnout.supervisor import Supervisor, add_restart_flags, restart_policy_from_args
from turnout.telemetry.metrics_http import serve_metrics

log = logging.getLogger(__name__)


def visible_gpus() -> list[str]:
    """The GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else what nvidia-smi lists."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def replica_env(replica: int, replicas: int, gpus: list[str], device: str) -> dict[str, str]:
    """Environment overrides of engine replica `replica` of `replicas`.

    With several GPUs each replica gets its own. Replicas running on the CPU share
    its cores instead of each starting a thread pool as wide as the machine (unless
    OMP_NUM_THREADS says otherwise).
    """
    on_cpu = device == "cpu" or (device == "auto" and not gpus)
    if on_cpu:
        if replicas < 2 or "OMP_NUM_THREADS" in os.environ:
            return {}
        return {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // replicas))}
    if len(gpus) < 2:
        return {}
    return {"CUDA_VISIBLE_DEVICES": gpus[replica % len(gpus)]}


def build_stack(args: argparse.Namespace, model: Path) -> Stack:
    ports = {name: getattr(args, f"{name}_port") or free_port() for name in ("tokenizer", "router")}
    engine_ports = [args.engine_port + i if args.engine_port else free_port() for i in range(args.engines)]
    addr = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    turnout = [sys.executable, "-m", "turnout.cli"]
    common = ["--log-level", args.log_level] if args.log_level else []
    if args.log_format:
        common += ["--log-format", args.log_format]
    # Security: the same TLS files for every child; the secrets travel in the environment (run()).
    common += stack_flags(args)
    grpc_ready = functools.partial(grpc_healthy, credentials=launcher_credentials(args))

    def metrics_port() -> int | None:
        return free_port() if args.metrics else None

    def metrics_flags(port: int | None) -> list[str]:
        return [] if port is None else ["--metrics-port", str(port)]

    gpus = visible_gpus() if args.engines > 1 else []
    engines = []
    for i, port in enumerate(engine_ports):
        engine = [*turnout, "engine", "--model", str(model), "--host", "127.0.0.1", "--port", str(port)]
        engine += ["--device", args.device, "--dtype", args.dtype, "--attention-backend", args.attention_backend]
        engine += ["--sampling-backend", args.sampling_backend]
        if args.served_model_name:
            # The engine serves the first name; the gateway answers to all of them.
            engine += ["--served-model-name", args.served_model_name[0]]
        engine += engine_flags(args)
        name = "engine" if args.engines == 1 else f"engine{i}"
        healthy = functools.partial(grpc_ready, f"127.0.0.1:{port}")
        env = replica_env(i, args.engines, gpus, args.device)
        engine_metrics = metrics_port()
        engines.append(
            Child(name, engine + common + metrics_flags(engine_metrics), healthy, 0, env, metrics_port=engine_metrics)
        )
    tokenizer = [*turnout, "tokenizer", "--model", str(model), "--host", "127.0.0.1", "--port", str(ports["tokenizer"])]
    if args.chat_template:
        tokenizer += ["--chat-template", args.chat_template]
    if args.reasoning_parser:
        tokenizer += ["--reasoning-parser", args.reasoning_parser]
    if args.tool_call_parser:
        tokenizer += ["--tool-call-parser", args.tool_call_parser]
    tokenizer += limit_args(args)
    router = [*turnout, "router", "--tokenizer", addr["tokenizer"], "--policy", args.policy]
    for port in engine_ports:
        router += ["--engine", f"127.0.0.1:{port}"]
    router += ["--host", "127.0.0.1", "--port", str(ports["router"])]
    if args.tokenizer_ready_timeout is not None:
        router += ["--tokenizer-ready-timeout", str(args.tokenizer_ready_timeout)]
    gateway = [*turnout, "gateway", "--router", addr["router"], "--host", args.host, "--port", str(args.port)]
    gateway += gateway_flags(args)
    tokenizer_metrics, router_metrics = metrics_port(), metrics_port()
    probe_host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
    scheme = "https" if args.ssl_certfile else "http"
    health_url = f"{scheme}://{probe_host}:{args.port}/health"
    ca_certs = str(args.ssl_ca_certs) if args.ssl_ca_certs else None
    return Stack(
        [
            *engines,
            Child(
                "tokenizer",
                tokenizer + common + metrics_flags(tokenizer_metrics),
                lambda: grpc_ready(addr["tokenizer"]),
                0,
                metrics_port=tokenizer_metrics,
            ),
            Child(
                "router",
                router + common + metrics_flags(router_metrics),
                lambda: grpc_ready(addr["router"]),
                1,
                metrics_port=router_metrics,
            ),
            Child("gateway", gateway + common, lambda: http_healthy(health_url, ca_certs), 2),
        ]
    )


def engine_flags(args: argparse.Namespace) -> list[str]:
    """The generation and runtime options of `turnout serve` passed on to every `turnout engine`."""
    flags: list[str] = []
    for name in (
        "scheduling_policy",
        "max_model_len",
        "kv_cache_memory",
        "num_kv_blocks",
        "grammar_max_whitespace",
        "think_start_token",
        "think_end_token",
        "gpu_memory_utilization",
        "cuda_graph_max_bs",
        "cuda_graph_max_seq_len",
    ):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    for switch in ("enable_custom_logit_processor", "disable_cuda_graph"):
        if getattr(args, switch):
            flags.append(f"--{switch.replace('_', '-')}")
    if args.overlap_schedule is not None:
        flags.append("--enable-overlap-schedule" if args.overlap_schedule else "--disable-overlap-schedule")
    for limit in request_limit_fields():
        if getattr(args, limit.name) is not None:
            flags += [limit_flag(limit), str(getattr(args, limit.name))]
    return flags


def gateway_flags(args: argparse.Namespace) -> list[str]:
    """The HTTP options of `turnout serve` passed on to `turnout gateway` (the key through the
    environment, so it does not show in `ps`)."""
    flags: list[str] = []
    if args.served_model_name:
        flags += ["--served-model-name", *args.served_model_name]
    for name in (
        "allowed_origins",
        "allowed_methods",
        "allowed_headers",
        "root_path",
        "max_request_bytes",
        "router_ready_timeout",
        "max_client_batch_size",
    ):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    if args.allow_credentials:
        flags.append("--allow-credentials")
    return flags


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="turnout serve")
    parser.description = "Run engine, tokenizer, router and gateway on this machine and serve HTTP."
    parser.add_argument("--model", type=Path, default=None, help="Hugging Face model folder (default: SmolLM2-135M)")
    parser.add_argument(
        "--served-model-name",
        nargs="+",
        default=None,
        metavar="NAME",
        help="names clients use for the model; responses report the first (default: the folder's name)",
    )
    parser.add_argument("--allowed-origins", default=None, help="CORS origins, a JSON list (gateway default: all)")
    parser.add_argument("--allowed-methods", default=None, help="CORS methods, a JSON list (gateway default: all)")
    parser.add_argument("--allowed-headers", default=None, help="CORS headers, a JSON list (gateway default: all)")
    parser.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    parser.add_argument("--root-path", default=None, help="path prefix behind a reverse proxy, e.g. /llm")
    parser.add_argument("--max-request-bytes", type=int, default=None, help="larger request bodies get 413")
    parser.add_argument(
        "--max-client-batch-size", type=int, default=None, help="most prompts per request; more get 400 (see gateway)"
    )
    parser.add_argument("--host", default="127.0.0.1", help="HTTP host of the gateway")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port of the gateway")
    for name in ("engine", "tokenizer", "router"):
        parser.add_argument(f"--{name}-port", type=int, default=0, help=f"gRPC port of the {name} (default: free)")
    parser.add_argument(
        "--engines",
        type=int,
        default=1,
        metavar="N",
        help="engine replicas behind the router, one per GPU when there are several; with --engine-port, "
        "replica i listens on that port + i (default: 1)",
    )
    parser.add_argument("--policy", default="cache_aware", choices=POLICIES, help="the router's routing policy")
    parser.add_argument(
        "--scheduling-policy",
        default=None,
        choices=SCHEDULING_POLICIES,
        help="engine: fcfs, or priority (the request field `priority`, lower first); with fcfs a request "
        "with a non-zero priority is refused (default: fcfs)",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--attention-backend", default="auto", help="engine: auto (triton on CUDA, torch on CPU), torch or triton"
    )
    parser.add_argument(
        "--sampling-backend",
        default="auto",
        help="engine: the sampler's draw, auto (triton on CUDA, torch on CPU), torch or triton",
    )
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument(
        "--kv-cache-memory",
        type=float,
        default=None,
        metavar="GIB",
        help="engine: KV pool size in GiB per engine (engine default: on CPU 4, at most a tenth of total RAM)",
    )
    parser.add_argument(
        "--num-kv-blocks", type=int, default=None, help="engine: KV pool size in blocks (overrides memory)"
    )
    parser.add_argument("--chat-template", default=None)
    parser.add_argument(
        "--grammar-max-whitespace",
        type=int,
        default=None,
        help="engine: longest whitespace run allowed between JSON tokens of a constraint (engine default: 4)",
    )
    parser.add_argument("--think-start-token", default=None, help="engine: the model's think-start token (<think>)")
    parser.add_argument("--think-end-token", default=None, help="engine: the model's think-end token (</think>)")
    parser.add_argument(
        "--enable-custom-logit-processor",
        action="store_true",
        help="engine: accept serialized custom logit processors (runs client code: trusted clients only)",
    )
    overlap = parser.add_mutually_exclusive_group()
    overlap.add_argument(
        "--disable-overlap-schedule",
        dest="overlap_schedule",
        action="store_false",
        default=None,
        help="engine: postprocess each step before scheduling the next (default: overlapped on CUDA)",
    )
    overlap.add_argument(
        "--enable-overlap-schedule",
        dest="overlap_schedule",
        action="store_true",
        default=None,
        help="engine: postprocess each step while the device runs the next, even on CPU",
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="engine, CUDA: share of the device's memory each engine may use, KV pool included (engine default: 0.9)",
    )
    parser.add_argument(
        "--disable-cuda-graph", action="store_true", help="engine: run decode steps eagerly, without CUDA graphs"
    )
    parser.add_argument(
        "--cuda-graph-max-bs",
        type=int,
        default=None,
        help="engine: largest decode batch replayed from a CUDA graph (engine default: running cap, at most 256)",
    )
    parser.add_argument(
        "--cuda-graph-max-seq-len",
        type=int,
        default=None,
        help="engine: longest sequence a replayed decode step may hold (engine default: 8192)",
    )
    parser.add_argument(
        "--reasoning-parser",
        default=None,
        choices=sorted(REASONING_PARSERS),
        help="the tokenizer splits <think> blocks into reasoning for requests that ask (default: none)",
    )
    parser.add_argument(
        "--tool-call-parser",
        default=None,
        choices=sorted(TOOL_PARSERS),
        help="the tokenizer reads tool calls for tool_choice 'auto' (default: none: such requests are refused)",
    )
    add_engine_limit_flags(parser, forwarded=True)
    add_tokenizer_limit_flags(parser.add_argument_group("tokenizer limits per request"), defaults_shown=False)
    parser.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for all to be healthy")
    parser.add_argument("--log-level", default=None)
    parser.add_argument("--log-format", default=None, choices=LOG_FORMATS, help="passed to every service")
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="serve Prometheus /metrics of the engine(s), tokenizer, router and launcher on free ports (printed at "
        "start); the gateway's is always at /metrics on its HTTP port",
    )
    add_security_flags(parser)
    parser.add_argument(
        "--tokenizer-ready-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="router: how long a request waits for a restarting tokenizer before 503 (router default: 5)",
    )
    parser.add_argument(
        "--router-ready-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="gateway: how long a request waits for a restarting router before 503 (gateway default: 10)",
    )
    add_restart_flags(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    from turnout.default_model import SERVED_NAME, prepare_default_model
    from turnout.logs import setup_logging

    setup_logging("launcher", args.log_level, args.log_format)
    if args.model is None:
        args.model = prepare_default_model()
        args.served_model_name = args.served_model_name or [SERVED_NAME]
    model = args.model
    if args.engines < 1:
        raise SystemExit(f"turnout serve: --engines must be at least 1, got {args.engines}")
    if not (model / "config.json").is_file():
        raise SystemExit(f"turnout serve: --model {model}: no config.json there")
    try:
        policy = restart_policy_from_args(args)
        # Children inherit the secrets (never on a command line or in the start log).
        os.environ.update(stack_environment(args))
        stack = build_stack(args, model)
    except (ValueError, OSError) as exc:
        raise SystemExit(f"turnout serve: {exc}") from None
    registry = CollectorRegistry()
    supervisor = Supervisor(stack, policy, registry)
    signal.signal(signal.SIGTERM, stack.request_stop)
    signal.signal(signal.SIGINT, stack.request_stop)
    try:
        if not stack.start(args.startup_timeout):
            return 0 if stack.stopping else 1
        url = f"{'https' if args.ssl_certfile else 'http'}://{args.host}:{args.port}"
        name = args.served_model_name[0] if args.served_model_name else model.name
        lines = [f"Turnout is serving {name} at {url}  (OpenAI API: {url}/v1; Ctrl-C stops)"]
        lines += [
            f"  {child.name} metrics: http://127.0.0.1:{child.metrics_port}/metrics"
            for child in stack.children
            if child.metrics_port is not None
        ]
        if args.metrics:
            server = serve_metrics(registry, "127.0.0.1", 0)
            lines.append(f"  launcher metrics: http://127.0.0.1:{server.server_port}/metrics")
        # One write: whoever waits for the ready line sees the metrics addresses with it.
        print("\n".join(lines), flush=True)
        return 0 if supervisor.run() else 1
    finally:
        stack.stop()
        log.info("stopped")


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(build_parser().parse_args(argv)))
