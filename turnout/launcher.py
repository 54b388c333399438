"""`turnout serve`: the whole stack on one machine as child processes on loopback.

`--engines N` starts N engine replicas behind the router (data parallelism):
on a machine with several GPUs each replica sees one (`CUDA_VISIBLE_DEVICES`),
round-robin over the GPUs when there are more replicas than GPUs; on the CPU the
replicas split the cores between their thread pools (`OMP_NUM_THREADS`).
`--api-server-count N` starts N gateways on the one HTTP port (gateway_replicas.py).

`--metrics` gives every gRPC service a free Prometheus port (printed once the stack is up; the
gateway always serves `/metrics` on its HTTP port), and the launcher one for its restart
counter. `--log-format` is passed to every child; the OTEL_* environment (tracing) reaches them
as it is.

Start order: engines and tokenizer, then, once they are healthy, the router and the
gateway together (the gateway's /health waits for the router, so the stack is
ready when both are healthy); a child that dies during start-up fails the start.
The router is not started with the engines: its channel to an engine that is not
listening yet backs off (up to 2 s), which would delay the ready line by more
than the router's own start (0.6 s) saves.
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
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from turnout.child_processes import Child, Stack, free_port, grpc_healthy, http_healthy
from turnout.cpu_cores import OMP_THREADS_ENV, CorePlan, allowed_cpus, can_bind, plan_cores, show_cpu_list
from turnout.flag_parser import FlagParser
from turnout.gateway_replicas import GatewayReplicas
from turnout.model_reference import ModelNotFound, ResolvedModel
from turnout.model_reference import resolve as resolve_model
from turnout.port_check import PlannedPort, port_problems
from turnout.ready_summary import engine_capacity, ready_lines
from turnout.security import (
    INTERNAL_TOKEN_ENV,
    ClientCredentials,
    add_security_flags,
    launcher_credentials,
    stack_environment,
    stack_flags,
    tls_from_args,
)
from turnout.serve_flags import (
    ENGINE,
    GATEWAY,
    ROUTER,
    TOKENIZER,
    add_serve_flags,
    child_flags,
    flag_environment,
    serve_config,
)
from turnout.supervisor import Supervisor, add_restart_flags, restart_policy_from_args
from turnout.telemetry.metrics_http import serve_metrics
from turnout.telemetry.service_setup import add_observability_flags

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


def replica_env(
    replica: int,
    replicas: int,
    gpus: list[str],
    device: str,
    tensor_parallel_size: int = 1,
    *,
    own_cores: bool = False,
) -> dict[str, str]:
    """Environment overrides of engine replica `replica` of `replicas`.

    With several GPUs each replica gets its own (with --tensor-parallel-size N, its own N: the
    engine's ranks take cuda:0..N-1 of what it sees). Replicas running on the CPU share its cores
    instead of each starting a thread pool as wide as the machine (unless OMP_NUM_THREADS says
    otherwise); a tensor-parallel engine splits its share between its ranks. A replica given cores of
    its own (`own_cores`: --cpu-cores) sizes its thread pool from them instead.
    """
    on_cpu = device == "cpu" or (device == "auto" and not gpus)
    if on_cpu:
        if replicas < 2 or own_cores or OMP_THREADS_ENV in os.environ:
            return {}
        return {OMP_THREADS_ENV: str(max(1, (os.cpu_count() or 1) // replicas))}
    tp = tensor_parallel_size
    if len(gpus) < 2 or (replicas == 1 and len(gpus) <= tp):
        return {}
    first = replica * tp
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpus[(first + r) % len(gpus)] for r in range(tp))}


def core_plan(args: argparse.Namespace) -> CorePlan | None:
    """With --cpu-reserved-cores N, the services' CPUs and each engine replica's (turnout/cpu_cores.py);
    ValueError for a plan that cannot be kept."""
    if not args.cpu_reserved_cores:
        return None
    if args.cpu_cores:
        raise ValueError("give --cpu-reserved-cores or --cpu-cores, not both (the first sets the second per replica)")
    if not can_bind():
        raise ValueError("--cpu-reserved-cores needs Linux (sched_setaffinity)")
    return plan_cores(allowed_cpus(), args.cpu_reserved_cores, args.engines)


def build_stack(args: argparse.Namespace, model: Path, tokenizer_folder: Path | None = None) -> Stack:
    """The children serving `model` (a resolved folder); the tokenizer reads `tokenizer_folder` (default: `model`)."""
    ports = {name: getattr(args, f"{name}_port") or free_port() for name in ("tokenizer", "router")}
    engine_ports = [args.engine_port + i if args.engine_port else free_port() for i in range(args.engines)]
    addr = {name: f"127.0.0.1:{port}" for name, port in ports.items()}
    turnout = [sys.executable, "-m", "turnout.cli"]
    common = ["--log-level", args.log_level] if args.log_level else []
    # Without the flag each child picks by the same rule as the launcher: TURNOUT_TTY tells it
    # whether the launcher's stderr, where its own goes through a pipe, is a terminal.
    if args.log_format:
        common += ["--log-format", args.log_format]
    # Security: the same TLS files for every child; the secrets travel in the environment (run()).
    common += stack_flags(args)
    grpc_ready = functools.partial(grpc_healthy, credentials=launcher_credentials(args))

    def metrics_port() -> int | None:
        return free_port() if args.metrics else None

    def metrics_flags(port: int | None) -> list[str]:
        return [] if port is None else ["--metrics-port", str(port)]

    tp = args.tensor_parallel_size or 1
    gpus = visible_gpus() if args.engines > 1 or tp > 1 else []
    plan = core_plan(args)
    services = plan.services if plan is not None else ()
    engines = []
    for i, port in enumerate(engine_ports):
        engine = [*turnout, "engine", "--model", str(model), "--host", "127.0.0.1", "--port", str(port)]
        if args.served_model_names:
            # The engine serves the first name; the gateway answers to all of them.
            engine += ["--served-model-name", args.served_model_names[0]]
        engine += child_flags(args, ENGINE)
        name = "engine" if args.engines == 1 else f"engine{i}"
        healthy = functools.partial(grpc_ready, f"127.0.0.1:{port}")
        cpus: tuple[int, ...] = ()
        if plan is not None:  # its compute threads on its share, the rest of it with the services
            engine += ["--cpu-cores", show_cpu_list(plan.engines[i])]
            cpus = tuple(sorted({*plan.services, *plan.engines[i]}))
        env = replica_env(i, args.engines, gpus, args.device, tp, own_cores=plan is not None)
        engine_metrics = metrics_port()
        engines.append(
            Child(
                name,
                engine + common + metrics_flags(engine_metrics),
                healthy,
                0,
                env,
                metrics_port=engine_metrics,
                port=port,
                cpus=cpus,
            )
        )
    tokenizer = [*turnout, "tokenizer", "--model", str(model), "--host", "127.0.0.1", "--port", str(ports["tokenizer"])]
    if tokenizer_folder is not None and tokenizer_folder != model:
        tokenizer += ["--tokenizer", str(tokenizer_folder)]
    tokenizer += child_flags(args, TOKENIZER)
    router = [*turnout, "router", "--tokenizer", addr["tokenizer"]]
    for port in engine_ports:
        router += ["--engine", f"127.0.0.1:{port}"]
    router += ["--host", "127.0.0.1", "--port", str(ports["router"]), *child_flags(args, ROUTER)]
    gateway = [*turnout, "gateway", "--router", addr["router"], *child_flags(args, GATEWAY)]
    tokenizer_metrics, router_metrics = metrics_port(), metrics_port()
    gateways, replicas = gateway_children(args, gateway + common)
    for child in gateways:
        child.cpus = services
    return Stack(
        [
            *engines,
            Child(
                "tokenizer",
                tokenizer + common + metrics_flags(tokenizer_metrics),
                lambda: grpc_ready(addr["tokenizer"]),
                0,
                metrics_port=tokenizer_metrics,
                port=ports["tokenizer"],
                cpus=services,
            ),
            Child(
                "router",
                router + common + metrics_flags(router_metrics),
                lambda: grpc_ready(addr["router"]),
                1,
                metrics_port=router_metrics,
                port=ports["router"],
                cpus=services,
            ),
            *gateways,
        ],
        on_stopped=replicas.close if replicas is not None else None,
    )


def gateway_children(args: argparse.Namespace, argv: list[str]) -> tuple[list[Child], GatewayReplicas | None]:
    """The gateway, or with --api-server-count N the N gateways sharing the HTTP port (gateway_replicas.py)
    and what they share. Started with the router: a gateway's /health is 503 until the router has a
    healthy engine."""
    scheme = "https" if args.ssl_certfile else "http"
    ca_certs = str(args.ssl_ca_certs) if args.ssl_ca_certs else None

    def healthy(host: str, port: int) -> Callable[[], bool]:
        return lambda: http_healthy(f"{scheme}://{host}:{port}/health", ca_certs)

    if args.api_server_count == 1:
        probe_host = "127.0.0.1" if args.host in ("0.0.0.0", "::", "") else args.host
        return [Child("gateway", argv, healthy(probe_host, args.port), 1, port=args.port)], None
    replicas = GatewayReplicas(args.host, args.port)
    children = []
    for i in range(args.api_server_count):
        own = free_port()
        # The later --host/--port win over the public ones child_flags wrote: this gateway's own port.
        own_argv = [*argv, *replicas.flags(), "--host", "127.0.0.1", "--port", str(own)]
        child = Child(
            f"gateway{i}", own_argv, healthy("127.0.0.1", own), 1, replicas.env(), port=own, pass_fds=(replicas.fd,)
        )
        children.append(child)
    return children, replicas


def build_parser(parser: FlagParser | None = None) -> FlagParser:
    parser = parser or FlagParser(prog="turnout serve")
    parser.description = (
        "Run engine, tokenizer, router and gateway on this machine and serve HTTP. Every flag of "
        "`turnout engine`, `turnout tokenizer`, `turnout router` and `turnout gateway` is accepted here and "
        "passed to that service (vLLM's and SGLang's spellings too); see docs/flags.md."
    )
    add_serve_flags(parser)
    add_observability_flags(parser, metrics_port=False)
    add_security_flags(parser)
    add_restart_flags(parser)
    return parser


def planned_ports(args: argparse.Namespace) -> list[PlannedPort]:
    """Every fixed port the stack will listen on (the free ones are picked when it starts)."""
    planned = [PlannedPort(args.host, args.port, "gateway --port")]
    if args.engine_port:
        for i in range(args.engines):
            flag = "engine --engine-port" if i == 0 else f"engine{i}: --engine-port + {i}"
            planned.append(PlannedPort("127.0.0.1", args.engine_port + i, flag))
    for name in ("tokenizer", "router"):
        if getattr(args, f"{name}_port"):
            planned.append(PlannedPort("127.0.0.1", getattr(args, f"{name}_port"), f"{name} --{name}-port"))
    return planned


def resolve_models(args: argparse.Namespace) -> tuple[ResolvedModel, ResolvedModel]:
    """The model folder and the tokenizer folder the children get (`MODEL`/`--model`, `--tokenizer`)."""
    from turnout.default_model import SERVED_NAME, prepare_default_model

    if args.model is None:
        folder = prepare_default_model()
        args.served_model_names = args.served_model_names or [SERVED_NAME]
        model = ResolvedModel(str(folder), folder, "folder")
    else:
        model = resolve_model(args.model, revision=args.revision, download_dir=args.download_dir)
    if args.tokenizer is None:
        return model, model
    return model, resolve_model(args.tokenizer, kind="tokenizer", download_dir=args.download_dir)


def run(args: argparse.Namespace) -> int:
    from turnout.logs import setup_logging

    setup_logging("launcher", args.log_level, args.log_format)
    try:
        serve_config(args)
        core_plan(args)  # a plan that cannot be kept fails here, before a model is fetched
    except ValueError as exc:
        raise SystemExit(f"turnout serve: {exc}") from None
    # Every value reaches the children on their command lines; a child must not read a TURNOUT_*
    # variable meant for `turnout serve` (the router's --tokenizer is an address, serve's a folder).
    for name in flag_environment():
        os.environ.pop(name, None)
    # Before anything is loaded: a busy port fails the start in a second, not after the model loads.
    problems = port_problems(planned_ports(args))
    if problems:
        raise SystemExit("\n".join(f"turnout serve: {problem}" for problem in problems))
    try:
        model, tokenizer = resolve_models(args)
    except ModelNotFound as exc:
        raise SystemExit(f"turnout serve: {exc}") from None
    # A Hub id is served under its own name, not its snapshot's commit hash.
    args.served_model_names = args.served_model_names or [model.name]
    try:
        policy = restart_policy_from_args(args)
        # Children inherit the secrets (never on a command line or in the start log).
        os.environ.update(stack_environment(args))
        stack = build_stack(args, model.folder, tokenizer.folder)
    except (ValueError, OSError) as exc:
        raise SystemExit(f"turnout serve: {exc}") from None
    registry = CollectorRegistry()
    supervisor = Supervisor(stack, policy, registry)
    signal.signal(signal.SIGTERM, stack.request_stop)
    signal.signal(signal.SIGINT, stack.request_stop)
    try:
        if not stack.start(args.startup_timeout):
            return 0 if stack.stopping else 1
        # One write: whoever waits for the ready line sees the rest of the summary with it.
        print("\n".join(summary(args, stack, registry)), flush=True)
        return 0 if supervisor.run() else 1
    finally:
        stack.stop()
        log.info("stopped")


def summary(args: argparse.Namespace, stack: Stack, registry: CollectorRegistry) -> list[str]:
    """The ready line and what follows it (addresses, each engine's KV capacity, metrics ports)."""
    url = f"{'https' if args.ssl_certfile else 'http'}://{args.host}:{args.port}"
    # The internal token the children got: GetLoad and GetModelInfo are internal RPCs.
    credentials = ClientCredentials(bearer=os.environ.get(INTERNAL_TOKEN_ENV), tls=tls_from_args(args))
    by_name = {child.name: child for child in stack.children}
    engines = {
        child.name: engine_capacity(f"127.0.0.1:{child.port}", credentials)
        for child in stack.children
        if child.name.startswith("engine")
    }
    metrics = [
        f"  {child.name} metrics: http://127.0.0.1:{child.metrics_port}/metrics"
        for child in stack.children
        if child.metrics_port is not None
    ]
    if args.metrics:
        server = serve_metrics(registry, "127.0.0.1", 0)
        metrics.append(f"  launcher metrics: http://127.0.0.1:{server.server_port}/metrics")
    router = f"127.0.0.1:{by_name['router'].port}"
    return ready_lines(args.served_model_names[0], url, router, engines, metrics)


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(build_parser().parse_args(argv)))
