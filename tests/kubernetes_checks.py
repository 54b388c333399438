"""Checks of a kustomize build of deploy/kubernetes/ against the code it runs.

Each check takes the built resources and returns a list of problems (empty when fine), so that
tests/test_deploy_kubernetes.py can run them on the real build and show each one failing on a
broken copy. What they compare against is read from the code: the real `turnout` parser, the
modules that run the gRPC health service, the services' drain times, the environment variables
the code reads, the engines' metric names and the gateway's open paths.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib
import inspect
import io
import re
from collections.abc import Callable
from pathlib import Path

import kubernetes_validate

from tests.kubernetes_manifests import (
    ROOT,
    Container,
    Resource,
    containers,
    find,
    labels,
    pod_templates,
    project_version,
    selects,
    service_for_host,
    split_address,
)

# The oldest Kubernetes the manifests are for: gRPC probes are GA from 1.27.
MIN_KUBERNETES = "1.27"
SERVING = ("engine", "tokenizer", "router", "gateway")
# The pod's app.kubernetes.io/component label -> the `turnout` subcommand it runs.
COMPONENT_COMMAND = {"engine": "engine", "tokenizer": "tokenizer", "router": "router", "gateway": "gateway"}
COMPONENT_COMMAND["model-init"] = "prepare-model"
# Loading weights or a tokenizer takes a while: these need a startupProbe.
SLOW_START = ("engine", "tokenizer")
# The image's user (deploy/Dockerfile's useradd): its home holds caches, so it must be writable.
HOME = "/home/turnout"

Check = Callable[[list[Resource]], list[str]]


class CliError(ValueError):
    pass


@functools.cache
def _parser() -> argparse.ArgumentParser:
    from turnout.cli import build_parser

    return build_parser()


def parse(argv: list[str]) -> argparse.Namespace:
    """`turnout ARGV` through the real parser; CliError with its message when it refuses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return _parser().parse_args(argv)
    except SystemExit:
        raise CliError(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "rejected") from None


def runs_grpc_health(subcommand: str) -> bool:
    """The subcommand's module serves through turnout.grpc_server.serve, which runs grpc.health.v1."""
    from turnout.cli import COMMANDS

    source = inspect.getsource(importlib.import_module(COMMANDS[subcommand][0]))
    return re.search(r"from turnout\.grpc_server import [^\n]*\bserve\b", source) is not None


def component(c: Container) -> str:
    return labels(c.workload["spec"]["template"]).get("app.kubernetes.io/component", "")


def serving(resources: list[Resource]) -> list[tuple[Container, argparse.Namespace]]:
    """The main containers that run a Turnout service, with their parsed flags."""
    out = []
    for c in containers(resources):
        if c.init or not c.runs_turnout:
            continue
        try:
            args = parse(c.argv())
        except CliError:
            continue  # check_commands reports it
        if args.command in SERVING:
            out.append((c, args))
    return out


def one(resources: list[Resource], command: str) -> tuple[Container, argparse.Namespace] | None:
    found = [(c, a) for c, a in serving(resources) if a.command == command]
    return found[0] if len(found) == 1 else None


# ---------------------------------------------------------------------------


def check_schema(resources: list[Resource]) -> list[str]:
    """Every resource against the official schemas (strict: unknown fields are errors), for the
    oldest Kubernetes supported and the newest the package knows."""
    problems = []
    for version in (MIN_KUBERNETES, kubernetes_validate.latest_version()):
        for r in resources:
            try:
                kubernetes_validate.validate(r, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                problems.append(f"{r['kind']}/{r['metadata'].get('name')} (Kubernetes {version}): {e.message}")
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(f"{r['kind']} {r.get('apiVersion')}: no schema in Kubernetes {version}")
    return problems


def check_commands(resources: list[Resource]) -> list[str]:
    """Each main container runs `turnout` (the image's entrypoint) with arguments the real parser
    accepts, the subcommand its pod's component label names; no `$(VAR)` is left unexpanded."""
    problems = []
    commands = set()
    for c in containers(resources):
        if c.init:
            continue
        if not c.runs_turnout:
            problems.append(f"{c.where}: command {c.spec['command']} replaces the image's `turnout`")
            continue
        argv = c.argv()
        if left := [a for a in argv if re.search(r"\$\([A-Za-z_]", a)]:
            problems.append(f"{c.where}: {left} refer to variables its env does not define")
        try:
            args = parse(argv)
        except CliError as e:
            problems.append(f"{c.where}: `turnout {' '.join(argv)}`: {e}")
            continue
        commands.add(args.command)
        expected = COMPONENT_COMMAND.get(component(c))
        if args.command != expected:
            problems.append(f"{c.where}: runs `turnout {args.command}` in a pod labelled {component(c)!r}")
    if missing := set(SERVING) - commands:
        problems.append(f"no container runs {sorted(missing)}")
    return problems


def check_ports(resources: list[Resource]) -> list[str]:
    """The named container ports are the ports the flags say, and so is the scrape annotation;
    services listen beyond loopback."""
    problems = []
    for c, args in serving(resources):
        main = "http" if args.command == "gateway" else "grpc"
        if c.port(main) != args.port:
            problems.append(f"{c.where}: port {main!r} is {c.port(main)}, --port is {args.port}")
        metrics_port = getattr(args, "metrics_port", None)
        if c.port("metrics") != metrics_port:
            problems.append(f"{c.where}: port 'metrics' is {c.port('metrics')}, --metrics-port is {metrics_port}")
        if args.host != "0.0.0.0":
            problems.append(f"{c.where}: --host {args.host} is unreachable from other pods")
        # Scrape annotations (the gateway serves /metrics on its HTTP port).
        annotations = c.workload["spec"]["template"]["metadata"].get("annotations") or {}
        scraped = metrics_port if args.command != "gateway" else args.port
        if annotations.get("prometheus.io/scrape") == "true" and annotations.get("prometheus.io/port") != str(scraped):
            problems.append(
                f"{c.where}: prometheus.io/port {annotations.get('prometheus.io/port')}, metrics on {scraped}"
            )
    return problems


def check_probes(resources: list[Resource]) -> list[str]:
    """gRPC probes ask the health service on the port the service serves, and only services that
    run it; HTTP probes ask the gateway's paths that need no key, and liveness does not depend on
    the router; startupProbes cover slow loads."""
    from gateway.middleware import OPEN_PATHS

    problems = []
    for c, args in serving(resources):
        needed = ["readinessProbe", "livenessProbe"] + (["startupProbe"] if args.command in SLOW_START else [])
        problems += [f"{c.where}: no {kind}" for kind in needed if kind not in c.spec]
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = c.spec.get(kind)
            if probe is None:
                continue
            if "grpc" in probe:
                if not runs_grpc_health(args.command):
                    problems.append(f"{c.where}: {kind} is gRPC, `turnout {args.command}` runs no gRPC health service")
                if probe["grpc"]["port"] != args.port:
                    problems.append(f"{c.where}: {kind} asks port {probe['grpc']['port']}, --port is {args.port}")
                if probe["grpc"].get("service", ""):
                    problems.append(f"{c.where}: {kind} asks service {probe['grpc']['service']!r}; the server's is ''")
            elif "httpGet" in probe:
                get = probe["httpGet"]
                if c.port(get["port"]) != args.port:
                    problems.append(f"{c.where}: {kind} asks port {get['port']}, --port is {args.port}")
                if get.get("path") not in OPEN_PATHS:
                    problems.append(f"{c.where}: {kind} path {get.get('path')} needs an API key once one is set")
                if kind == "livenessProbe" and get.get("path") in ("/health", "/health_generate"):
                    problems.append(f"{c.where}: liveness on {get['path']} restarts gateways while the router is down")
            else:
                problems.append(f"{c.where}: {kind} is neither gRPC nor HTTP: {probe}")
    return problems


def check_selectors(resources: list[Resource]) -> list[str]:
    """Workloads select their own pods; each Service, PDB and Ingress reaches pods or Services that
    exist, on ports that exist."""
    problems = []
    templates = [(w, t) for w, t in pod_templates(resources) if w["kind"] != "Job"]
    for w, t in templates:
        if not selects(w["spec"]["selector"].get("matchLabels"), labels(t)):
            problems.append(f"{w['kind']}/{w['metadata']['name']}: selector does not match its pod labels")
    pods = {id(c.workload): c for c in containers(resources) if not c.init}
    for svc in find(resources, "Service"):
        name = svc["metadata"]["name"]
        chosen = [
            pods[id(w)] for w, t in templates if selects(svc["spec"].get("selector"), labels(t)) and id(w) in pods
        ]
        if not chosen:
            problems.append(f"Service/{name}: selector {svc['spec'].get('selector')} matches no pods")
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            problems += [
                f"Service/{name}: targetPort {target} is not a port of {c.where}"
                for c in chosen
                if c.port(target) is None
            ]
    for pdb in find(resources, "PodDisruptionBudget"):
        match = pdb["spec"]["selector"].get("matchLabels")
        if not any(selects(match, labels(t)) for _, t in templates):
            problems.append(f"PodDisruptionBudget/{pdb['metadata']['name']}: selects no pods")
    for ing in find(resources, "Ingress"):
        for rule in ing["spec"].get("rules") or []:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                svcs = find(resources, "Service", backend["name"])
                ports = [p for s in svcs for p in s["spec"]["ports"]]
                wanted = backend["port"]
                if not any(p.get("name") == wanted.get("name") or p["port"] == wanted.get("number") for p in ports):
                    problems.append(
                        f"Ingress/{ing['metadata']['name']}: no Service {backend['name']} with port {wanted}"
                    )
    return problems


def _target(resources: list[Resource], address: str, namespace: str, command: str, what: str) -> list[str]:
    """`address` names a Service in front of the pods running `command`, on the port they serve."""
    host, port = split_address(address)
    svc = service_for_host(resources, host, namespace)
    if svc is None:
        return [f"{what} {address}: no Service {host} in namespace {namespace}"]
    target = one(resources, command)
    if target is None:
        return [f"{what} {address}: no single `turnout {command}` container"]
    c, args = target
    if not selects(svc["spec"].get("selector"), labels(c.workload["spec"]["template"])):
        return [f"{what} {address}: Service {host} does not select the {command} pods"]
    ports = [p for p in svc["spec"]["ports"] if p["port"] == port]
    if not ports or c.port(ports[0].get("targetPort", port)) != args.port:
        return [f"{what} {address}: Service {host} port {port} does not lead to the {command}'s --port {args.port}"]
    return []


def check_addresses(resources: list[Resource]) -> list[str]:
    """The router's --tokenizer and the gateway's --router name the Services of those pods."""
    problems = []
    for c, args in serving(resources):
        namespace = c.workload["metadata"].get("namespace", "default")
        if args.command == "router":
            for address in args.tokenizer:
                problems += _target(resources, address, namespace, "tokenizer", "router: --tokenizer")
        if args.command == "gateway":
            problems += _target(resources, args.router, namespace, "router", "gateway: --router")
    return problems


def check_engine_discovery(resources: list[Resource]) -> list[str]:
    """The router's one --engine is the headless Service of the engine StatefulSet (one address per
    ready pod), looked up again often enough for scaling to need no restart."""
    router = one(resources, "router")
    engine = one(resources, "engine")
    if router is None or engine is None:
        return ["no single router and engine"]
    (rc, rargs), (ec, _) = router, engine
    if len(rargs.engine) != 1:
        return [f"router: --engine {rargs.engine}: one name for every engine replica is needed"]
    namespace = rc.workload["metadata"].get("namespace", "default")
    problems = _target(resources, rargs.engine[0], namespace, "engine", "router: --engine")
    svc = service_for_host(resources, split_address(rargs.engine[0])[0], namespace)
    if svc is not None:
        if svc["spec"].get("clusterIP") != "None":
            problems.append(f"Service/{svc['metadata']['name']}: not headless; its name would resolve to one address")
        if svc["spec"].get("publishNotReadyAddresses"):
            problems.append(f"Service/{svc['metadata']['name']}: publishes engines that are not ready")
        if ec.workload["kind"] == "StatefulSet" and ec.workload["spec"]["serviceName"] != svc["metadata"]["name"]:
            problems.append(f"{ec.where}: serviceName is not the router's engine Service")
    if not 0 < rargs.dns_refresh_interval <= 30:
        problems.append(f"router: --dns-refresh-interval {rargs.dns_refresh_interval}: new engines wait too long")
    return problems


@functools.cache
def code_text() -> str:
    return "\n".join(
        p.read_text() for d in ("turnout", "services", "gateway") for p in sorted((ROOT / d).rglob("*.py"))
    )


def check_env(resources: list[Resource]) -> list[str]:
    """Every variable a container sets is read by the code, or expanded into its own arguments;
    every secretKeyRef names a Secret of the build and, unless optional, a key it has."""
    problems = []
    secrets = {s["metadata"]["name"]: s for s in find(resources, "Secret")}
    for c in containers(resources):
        for name, entry in c.env.items():
            if name not in c.referenced_variables() and not re.search(rf"\b{re.escape(name)}\b", code_text()):
                problems.append(f"{c.where}: sets {name}, which no code reads")
            ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
            if ref is None:
                continue
            secret = secrets.get(ref["name"])
            if secret is None:
                problems.append(f"{c.where}: {name} from Secret {ref['name']}, which the build lacks")
            elif not ref.get("optional") and ref["key"] not in (secret.get("data") or {}):
                problems.append(f"{c.where}: {name} from key {ref['key']}, not in Secret {ref['name']}")
    return problems


def check_secrets(resources: list[Resource]) -> list[str]:
    """Every service gets the internal token from a Secret (not optional); no secret is written in
    a manifest."""
    from turnout.security import ADMIN_KEY_ENV, API_KEY_ENV, INTERNAL_TOKEN_ENV

    problems = []
    for c, _ in serving(resources):
        entry = c.env.get(INTERNAL_TOKEN_ENV) or {}
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
        if ref is None or ref.get("optional"):
            problems.append(f"{c.where}: {INTERNAL_TOKEN_ENV} does not come from a Secret it requires")
    for c in containers(resources):
        for name in (INTERNAL_TOKEN_ENV, API_KEY_ENV, ADMIN_KEY_ENV):
            if "value" in (c.env.get(name) or {}):
                problems.append(f"{c.where}: {name} written in the manifest")
    return problems


def check_security(resources: list[Resource]) -> list[str]:
    """Non-root, no privilege escalation, no capabilities, a read-only root filesystem with the
    paths the code writes (home caches, /tmp) on emptyDir volumes; no service-account token."""
    problems = []
    for w, t in pod_templates(resources):
        pod, where = t["spec"], f"{w['kind']}/{w['metadata']['name']}"
        context = pod.get("securityContext") or {}
        if not context.get("runAsNonRoot") or context.get("runAsUser") == 0:
            problems.append(f"{where}: may run as root: {context}")
        if pod.get("automountServiceAccountToken") is not False:
            problems.append(f"{where}: mounts a service-account token it has no use for")
    for c in containers(resources):
        context = c.spec.get("securityContext") or {}
        if context.get("allowPrivilegeEscalation") is not False or context.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{c.where}: allowPrivilegeEscalation/readOnlyRootFilesystem not locked: {context}")
        if "ALL" not in ((context.get("capabilities") or {}).get("drop") or []):
            problems.append(f"{c.where}: capabilities not dropped")
        if c.init:
            continue
        for path in (HOME + "/.cache", "/tmp"):
            mount = c.mount(path)
            if mount is None or mount.get("readOnly") or "emptyDir" not in c.volume(mount):
                problems.append(f"{c.where}: {path} is not on a writable emptyDir")
    return problems


def check_model_volume(resources: list[Resource]) -> list[str]:
    """model-init writes --output into a PersistentVolumeClaim; engine and tokenizer read --model
    from the same claim, mounted read-only (no fsGroup: nothing to chown), and wait for the folder."""
    problems = []
    writers = [c for c in containers(resources) if component(c) == "model-init" and not c.init]
    if len(writers) != 1:
        return [f"{len(writers)} model-init containers"]
    output = parse(writers[0].argv()).output
    wmount = writers[0].mount(str(output))
    if wmount is None or wmount.get("readOnly"):
        return [f"{writers[0].where}: --output {output} is not on a writable mount"]
    claim = (writers[0].volume(wmount).get("persistentVolumeClaim") or {}).get("claimName")
    if not find(resources, "PersistentVolumeClaim", claim):
        problems.append(f"{writers[0].where}: --output is not on a PersistentVolumeClaim of the build")
    for c, args in serving(resources):
        if args.command not in ("engine", "tokenizer"):
            continue
        if Path(args.model) != output:
            problems.append(f"{c.where}: --model {args.model} is not what model-init writes ({output})")
        mount = c.mount(str(args.model))
        volume = c.volume(mount) if mount else {}
        if (volume.get("persistentVolumeClaim") or {}).get("claimName") != claim:
            problems.append(f"{c.where}: --model {args.model} is not on claim {claim}")
        elif not (mount or {}).get("readOnly"):
            problems.append(f"{c.where}: the model volume is mounted writable")
        if (c.pod.get("securityContext") or {}).get("fsGroup") is not None:
            problems.append(f"{c.where}: an fsGroup has the kubelet walk the whole model volume at each start")
        waits = [i for i in c.pod.get("initContainers") or [] if f"{args.model}/config.json" in str(i.get("command"))]
        if not waits:
            problems.append(f"{c.where}: no init container waits for {args.model}/config.json")
    return problems


def drain_seconds(command: str) -> float:
    """How long a service may take to stop after SIGTERM, from its code."""
    from gateway.main import GRACEFUL_SHUTDOWN_S
    from turnout.grpc_server import serve

    if command == "gateway":
        return GRACEFUL_SHUTDOWN_S
    grace = float(inspect.signature(serve).parameters["grace_s"].default)
    if command == "engine":  # then the step loop stops: EngineLoop.shutdown joins its thread
        grace += _engine_loop_join_timeout()
    return grace


def _engine_loop_join_timeout() -> float:
    """The timeout of the thread join in EngineLoop.shutdown, read from the source (importing the
    engine would import torch: a minute on a busy machine)."""
    tree = ast.parse((ROOT / "services" / "engine" / "engine_loop.py").read_text())
    (loop,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "EngineLoop"]
    (shutdown,) = [n for n in loop.body if isinstance(n, ast.FunctionDef) and n.name == "shutdown"]
    for call in ast.walk(shutdown):
        if isinstance(call, ast.Call) and getattr(call.func, "attr", None) == "join":
            for kw in call.keywords:
                value = kw.value.value if isinstance(kw.value, ast.Constant) else None
                if kw.arg == "timeout" and isinstance(value, int | float):
                    return float(value)
    raise AssertionError("EngineLoop.shutdown no longer joins its thread with a timeout: update drain_seconds")


def pre_stop_sleep(c: Container) -> float:
    command = (((c.spec.get("lifecycle") or {}).get("preStop") or {}).get("exec") or {}).get("command") or []
    return float(command[1]) if len(command) == 2 and command[0] == "sleep" else 0.0


def check_grace(resources: list[Resource]) -> list[str]:
    """terminationGracePeriodSeconds covers the preStop sleep and the service's own drain; an
    engine keeps serving (preStop) until the router has looked its name up again."""
    problems = []
    router = one(resources, "router")
    for c, args in serving(resources):
        sleep = pre_stop_sleep(c)
        needed = sleep + drain_seconds(args.command)
        grace = c.pod.get("terminationGracePeriodSeconds", 30)
        if grace < needed:
            problems.append(f"{c.where}: terminationGracePeriodSeconds {grace} < preStop {sleep} + drain")
        if sleep == 0:
            problems.append(f"{c.where}: no preStop sleep; it stops before its endpoint is gone")
        if args.command == "engine" and router is not None and sleep < router[1].dns_refresh_interval:
            problems.append(f"{c.where}: stops before the router's next DNS lookup drops it")
    return problems


def check_resources(resources: list[Resource]) -> list[str]:
    """Every container asks for CPU and memory and has a memory limit."""
    problems = []
    for c in containers(resources):
        if c.init:
            continue
        res = c.spec.get("resources") or {}
        missing = {"cpu", "memory"} - (res.get("requests") or {}).keys() | (
            {"memory"} - (res.get("limits") or {}).keys()
        )
        if missing:
            problems.append(f"{c.where}: no request or limit for {sorted(missing)}")
    return problems


def check_image(resources: list[Resource]) -> list[str]:
    """Every container runs the image of deploy/Dockerfile, tagged with the project's version."""
    wanted = f"turnout:{project_version()}"
    return [
        f"{c.where}: image {c.spec.get('image')}, not {wanted}"
        for c in containers(resources)
        if c.spec.get("image") != wanted
    ]


def device_check(gpu: bool) -> Check:
    """The engine's --device and its GPU request agree: cuda and one GPU, or cpu and none."""

    def check(resources: list[Resource]) -> list[str]:
        engine = one(resources, "engine")
        if engine is None:
            return ["no single engine"]
        c, args = engine
        gpus = int(((c.spec.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0))
        if gpu and (args.device != "cuda" or gpus < 1):
            return [f"{c.where}: --device {args.device} with {gpus} GPUs on the GPU overlay"]
        if not gpu and (args.device != "cpu" or gpus):
            return [f"{c.where}: --device {args.device} with {gpus} GPUs on the CPU default"]
        return []

    return check


def engine_metric_names() -> set[str]:
    """The series an engine exports, from its own registry."""
    from turnout.telemetry.engine_metrics import EngineGauges, EngineMetrics

    metrics = EngineMetrics()
    metrics.watch(
        lambda: EngineGauges(
            running=0, waiting=0, kv_cache_usage=0.0, prefix_queried_tokens=0, prefix_hit_tokens=0, preemptions=0
        )
    )
    return {sample.name for family in metrics.registry.collect() for sample in family.samples} | {
        family.name for family in metrics.registry.collect()
    }


def check_autoscaling(resources: list[Resource]) -> list[str]:
    """The HPA scales the engine workload on a series the engines export, which they serve on a
    metrics port; a PDB limits how many engines a drain takes."""
    problems = []
    engine = one(resources, "engine")
    if engine is None:
        return ["no single engine"]
    c, args = engine
    if args.metrics_port is None:
        problems.append(f"{c.where}: no --metrics-port, nothing to scrape for the autoscaler")
    hpas = find(resources, "HorizontalPodAutoscaler")
    if not hpas:
        problems.append("no HorizontalPodAutoscaler")
    for hpa in hpas:
        ref = hpa["spec"]["scaleTargetRef"]
        if (ref["kind"], ref["name"]) != (c.workload["kind"], c.workload["metadata"]["name"]):
            problems.append(f"HPA/{hpa['metadata']['name']}: scales {ref['kind']}/{ref['name']}, not the engines")
        for metric in hpa["spec"].get("metrics") or []:
            name = (
                (metric.get("pods") or metric.get("object") or metric.get("external") or {})
                .get("metric", {})
                .get("name")
            )
            if name not in engine_metric_names():
                problems.append(f"HPA/{hpa['metadata']['name']}: metric {name} is not an engine series")
    pdbs = [
        p
        for p in find(resources, "PodDisruptionBudget")
        if selects(p["spec"]["selector"].get("matchLabels"), labels(c.workload["spec"]["template"]))
    ]
    if not pdbs:
        problems.append("no PodDisruptionBudget for the engines")
    return problems


COMMON_CHECKS: dict[str, Check] = {
    "schema": check_schema,
    "commands": check_commands,
    "ports": check_ports,
    "probes": check_probes,
    "selectors": check_selectors,
    "addresses": check_addresses,
    "engine_discovery": check_engine_discovery,
    "env": check_env,
    "secrets": check_secrets,
    "security": check_security,
    "model_volume": check_model_volume,
    "grace": check_grace,
    "resources": check_resources,
    "image": check_image,
}
# build -> the checks it must pass.
CHECKS: dict[str, dict[str, Check]] = {
    "base": {**COMMON_CHECKS, "device": device_check(gpu=False)},
    "single-node": {**COMMON_CHECKS, "device": device_check(gpu=False)},
    "gpu": {**COMMON_CHECKS, "device": device_check(gpu=True)},
    "autoscaling": {**COMMON_CHECKS, "device": device_check(gpu=True), "autoscaling": check_autoscaling},
}
