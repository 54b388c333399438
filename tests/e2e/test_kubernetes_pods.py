"""The Kubernetes base's pods, run as local processes: what the manifests promise holds.

Each serving container of the built base runs as it would in its pod: its arguments (Kubernetes'
`$(VAR)` expanded), its environment (literal values, and secretKeyRefs from the operator's
secrets.env, optional keys left unset when missing), HOME on an empty folder (the emptyDir). Only
what a cluster provides differs: the model folder is the tiny test model at the path model-init
writes, Service names are `localhost` (a DNS name, as the router's --engine is there) and every
port is a free one. Then the probes are asked as the kubelet asks them, the HPA's metric is read
from the engine's metrics port, and SIGTERM must end each process within its pod's grace period.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kubernetes_checks import parse, pre_stop_sleep, serving
from tests.kubernetes_manifests import (
    KUBERNETES,
    ROOT,
    Container,
    Resource,
    copy_tree,
    find,
    kustomize,
    labels,
    selects,
    service_for_host,
    split_address,
)
from turnout.child_processes import free_port, grpc_healthy

pytestmark = pytest.mark.e2e

# Started in this order (each one's peers first) and stopped in reverse.
ORDER = ("engine", "tokenizer", "router", "gateway")
PORT_FLAGS = ("--port", "--metrics-port")
ADDRESS_FLAGS = ("--engine", "--tokenizer", "--router")


@dataclass
class Pod:
    container: Container
    command: str
    argv: list[str]
    env: dict[str, str]
    ports: dict[int, int]  # the manifest's port -> the local one
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""

    def local(self, port: int | str) -> int:
        number = self.container.port(port)
        assert number is not None, f"{self.container.where}: no port {port}"
        return self.ports[number]


def secret_values(resources: list[Resource]) -> dict[tuple[str, str], str]:
    import base64

    return {
        (s["metadata"]["name"], key): base64.b64decode(value).decode()
        for s in find(resources, "Secret")
        for key, value in (s.get("data") or {}).items()
    }


def pod_env(c: Container, secrets: dict[tuple[str, str], str], home: Path) -> dict[str, str]:
    from services.engine.cpu_kernels import build_dir

    # The one addition: this machine's build of the engine's C++ CPU kernels. The image has no
    # compiler, so its engines use the torch path; here an empty HOME would have the engine
    # compile the kernels first (minutes on a busy machine).
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": str(home)}
    env["TURNOUT_CPU_KERNELS_DIR"] = str(build_dir())
    for name, entry in c.env.items():
        if "value" in entry:
            env[name] = entry["value"]
            continue
        ref = entry["valueFrom"]["secretKeyRef"]
        value = secrets.get((ref["name"], ref["key"]))
        if value is None:
            assert ref.get("optional"), f"{c.where}: {name} needs a key the Secret lacks"
            continue  # Kubernetes leaves an optional variable whose key is missing unset
        env[name] = value
    return env


def localize(resources: list[Resource], pods: dict[str, Pod], model: Path) -> None:
    """Rewrite each pod's arguments for this machine: ports, peers' addresses, the model folder."""
    namespace = "turnout"
    for pod in pods.values():
        argv = pod.argv
        for i, arg in enumerate(argv[:-1]):
            value = argv[i + 1]
            if arg in PORT_FLAGS:
                argv[i + 1] = str(pod.ports[int(value)])
            elif arg == "--host":
                argv[i + 1] = "127.0.0.1"
            elif arg == "--model":
                assert value == "/models/default", value
                argv[i + 1] = str(model)
            elif arg in ADDRESS_FLAGS:
                host, port = split_address(value)
                svc = service_for_host(resources, host, namespace)
                assert svc is not None, f"{pod.container.where}: {arg} {value} names no Service"
                (peer,) = [
                    p
                    for p in pods.values()
                    if selects(svc["spec"].get("selector"), labels(p.container.workload["spec"]["template"]))
                ]
                (svc_port,) = [p for p in svc["spec"]["ports"] if p["port"] == port]
                argv[i + 1] = f"localhost:{peer.local(svc_port['targetPort'])}"


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> list[Resource]:
    return kustomize(copy_tree(tmp_path_factory.mktemp("k8s")) / "base")


@pytest.fixture(scope="module")
def pods(
    base: list[Resource], tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Pod]]:
    secrets = secret_values(base)
    logs = tmp_path_factory.mktemp("logs")
    found: dict[str, Pod] = {}
    for c, args in serving(base):
        ports = {p["containerPort"]: free_port() for p in c.spec.get("ports") or []}
        env = pod_env(c, secrets, tmp_path_factory.mktemp(f"{args.command}-home"))
        found[args.command] = Pod(c, args.command, c.argv(), env, ports, logs / f"{args.command}.log")
    assert set(found) == set(ORDER)
    localize(base, found, tiny_model_dir)
    try:
        for command in ORDER:
            pod = found[command]
            parse(pod.argv)  # still a valid command line after the rewrite
            with pod.log_path.open("ab") as log:
                pod.process = subprocess.Popen(
                    [sys.executable, "-m", "turnout.cli", *pod.argv],
                    cwd=pod.env["HOME"],
                    env=pod.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        yield found
    finally:
        for pod in found.values():
            if pod.process is not None and pod.process.poll() is None:
                pod.process.kill()
                pod.process.wait()


def probe_ok(pod: Pod, probe: dict[str, Any]) -> bool:
    if "grpc" in probe:
        return grpc_healthy(f"127.0.0.1:{pod.local(probe['grpc']['port'])}")
    get = probe["httpGet"]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{pod.local(get['port'])}{get['path']}", timeout=5) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def wait_for(pod: Pod, kind: str) -> None:
    """Ask `kind` as the kubelet would until it passes, within what the startupProbe (or, for a
    pod without one, the readinessProbe's first minute) allows."""
    spec = pod.container.spec
    budget = spec.get("startupProbe", {"periodSeconds": 5, "failureThreshold": 12})
    deadline = time.monotonic() + budget.get("periodSeconds", 10) * budget.get("failureThreshold", 3)
    while not probe_ok(pod, spec[kind]):
        assert pod.process is not None and pod.process.poll() is None, f"{pod.command} exited:\n{pod.log()}"
        assert time.monotonic() < deadline, f"{pod.container.where}: {kind} never passed:\n{pod.log()}"
        time.sleep(0.5)


def test_probes_pass_metrics_serve_and_sigterm_ends_each_pod_in_its_grace(pods: dict[str, Pod]) -> None:
    for command in ORDER:
        pod = pods[command]
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            if kind in pod.container.spec:
                wait_for(pod, kind)

    # The autoscaler's metric is on the engine's metrics port, where Prometheus scrapes it.
    hpa = yaml.safe_load((KUBERNETES / "components" / "autoscaling" / "engine-hpa.yaml").read_text())
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    engine = pods["engine"]
    with urllib.request.urlopen(f"http://127.0.0.1:{engine.local('metrics')}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    for name in names:
        assert f"\n{name} " in text, f"{name} not on the engine's metrics port"

    # SIGTERM (after the preStop sleep, which only waits) ends each within what is left of its grace.
    for command in reversed(ORDER):
        pod = pods[command]
        assert pod.process is not None
        allowed = pod.container.pod.get("terminationGracePeriodSeconds", 30) - pre_stop_sleep(pod.container)
        started = time.monotonic()
        pod.process.send_signal(signal.SIGTERM)
        pod.process.wait(timeout=allowed)
        assert time.monotonic() - started < allowed
        assert pod.process.returncode == 0, f"{command} exited with {pod.process.returncode}"
