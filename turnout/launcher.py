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

from turnout.child_processes import Child, Stack, free_port, grpc_healthy, http_healthy
from turnout.flag_parser import FlagParser
from turnout.security import add_security_flags, launcher_credentials, stack_environment, stack_flags
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
        if args.served_model_names:
            # The engine serves the first name; the gateway answers to all of them.
            engine += ["--served-model-name", args.served_model_names[0]]
        engine += child_flags(args, ENGINE)
        name = "engine" if args.engines == 1 else f"engine{i}"
        healthy = functools.partial(grpc_ready, f"127.0.0.1:{port}")
        env = replica_env(i, args.engines, gpus, args.device)
        engine_metrics = metrics_port()
        engines.append(
            Child(name, engine + common + metrics_flags(engine_metrics), healthy, 0, env, metrics_port=engine_metrics)
        )
    tokenizer = [*turnout, "tokenizer", "--model", str(model), "--host", "127.0.0.1", "--port", str(ports["tokenizer"])]
    if args.tokenizer:
        tokenizer += ["--tokenizer", str(args.tokenizer)]
    tokenizer += child_flags(args, TOKENIZER)
    router = [*turnout, "router", "--tokenizer", addr["tokenizer"]]
    for port in engine_ports:
        router += ["--engine", f"127.0.0.1:{port}"]
    router += ["--host", "127.0.0.1", "--port", str(ports["router"]), *child_flags(args, ROUTER)]
    gateway = [*turnout, "gateway", "--router", addr["router"], *child_flags(args, GATEWAY)]
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


def run(args: argparse.Namespace) -> int:
    from turnout.default_model import SERVED_NAME, prepare_default_model
    from turnout.logs import setup_logging

    setup_logging("launcher", args.log_level, args.log_format)
    try:
        serve_config(args)
    except ValueError as exc:
        raise SystemExit(f"turnout serve: {exc}") from None
    # Every value reaches the children on their command lines; a child must not read a TURNOUT_*
    # variable meant for `turnout serve` (the router's --tokenizer is an address, serve's a folder).
    for name in flag_environment():
        os.environ.pop(name, None)
    if args.model is None:
        model = prepare_default_model()
        args.served_model_names = args.served_model_names or [SERVED_NAME]
    else:
        model = Path(args.model)
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
        name = args.served_model_names[0] if args.served_model_names else model.name
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
