"""deploy/kubernetes/, offline: the kustomize builds validated against the official Kubernetes
schemas and checked against the code (tests/kubernetes_checks.py), each check shown failing on a
broken copy; the kustomizations list exactly the files there are; docs/deploy.md's commands name
what exists."""

from __future__ import annotations

import copy
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.kubernetes_checks import CHECKS, MIN_KUBERNETES, check_grace, drain_seconds, parse, runs_grpc_health
from tests.kubernetes_manifests import (
    BUILDS,
    KUBERNETES,
    ROOT,
    SECRETS_ENV,
    Resource,
    copy_tree,
    find,
    kustomizations,
    kustomize,
    referenced_files,
)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Resource]]:
    tree = copy_tree(tmp_path_factory.mktemp("k8s"))
    return {name: kustomize(tree / path) for name, path in BUILDS.items()}


CASES = [(build, check) for build, checks in CHECKS.items() for check in checks]


@pytest.mark.parametrize(("build", "check"), CASES, ids=[f"{b}-{c}" for b, c in CASES])
def test_build(built: dict[str, list[Resource]], build: str, check: str) -> None:
    assert CHECKS[build][check](built[build]) == []


def test_builds_hold_the_stack(built: dict[str, list[Resource]]) -> None:
    kinds = {r["kind"] for r in built["base"]}
    assert {"Namespace", "Secret", "PersistentVolumeClaim", "Job", "StatefulSet", "Deployment"} <= kinds
    assert {"Service", "Ingress", "PodDisruptionBudget"} <= kinds
    assert not find(built["base"], "HorizontalPodAutoscaler")  # only with components/autoscaling
    assert {r["metadata"].get("namespace") for r in built["base"] if r["kind"] != "Namespace"} == {"turnout"}
    # The generated Secret's hashed name reached every reference to it.
    (secret,) = find(built["base"], "Secret")
    assert re.fullmatch(r"turnout-secrets-[a-z0-9]+", secret["metadata"]["name"])
    assert secret["metadata"]["name"] in yaml.safe_dump(find(built["base"], "Deployment"))


def test_the_build_needs_the_operators_secrets(tmp_path: Path) -> None:
    """Without secrets.env kustomize refuses, naming it: no stack without an internal token."""
    tree = copy_tree(tmp_path, secrets=None)
    with pytest.raises(RuntimeError, match=r"secrets\.env"):
        kustomize(tree / "base")


def test_secrets_env_is_kept_out_of_git() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", str(KUBERNETES / SECRETS_ENV)], cwd=ROOT, check=False, capture_output=True
    )
    assert ignored.returncode == 0, f"deploy/kubernetes/{SECRETS_ENV} is not in .gitignore"


@pytest.mark.parametrize("kustomization", list(kustomizations()), ids=lambda p: str(p.parent.relative_to(KUBERNETES)))
def test_kustomization_lists_exactly_the_files_present(kustomization: Path) -> None:
    files, directories = referenced_files(kustomization)
    folder = kustomization.parent
    present = {p.name for p in folder.iterdir() if p.is_file() and p.name != "kustomization.yaml"}
    # The operator's secrets.env is named but not in the repository.
    generated_inputs = {Path(SECRETS_ENV).name} if folder == KUBERNETES / Path(SECRETS_ENV).parent else set()
    assert files - generated_inputs == present - generated_inputs
    for directory in directories:
        assert (folder / directory / "kustomization.yaml").is_file(), f"{directory} is not a kustomization"


def resource_files() -> list[Path]:
    """The files kustomizations list as resources (patches are partial: the builds cover them)."""
    out = []
    for kustomization in kustomizations():
        resources = yaml.safe_load(kustomization.read_text()).get("resources") or []
        out += [kustomization.parent / r for r in resources if (kustomization.parent / r).is_file()]
    return sorted(out)


@pytest.mark.parametrize("path", resource_files(), ids=lambda p: str(p.relative_to(KUBERNETES)))
def test_each_resource_file_validates(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        for version in (MIN_KUBERNETES, kubernetes_validate.latest_version()):
            kubernetes_validate.validate(doc, version, strict=True)


def test_the_code_facts_the_checks_rely_on() -> None:
    """The checks read these from the code; make sure they still mean what the checks assume."""
    import inspect

    from turnout.grpc_server import serve

    assert "add_HealthServicer_to_server" in inspect.getsource(serve)
    assert {c for c in ("engine", "tokenizer", "router", "gateway") if runs_grpc_health(c)} == {
        "engine",
        "tokenizer",
        "router",
    }
    assert drain_seconds("engine") > drain_seconds("router") > 0
    assert parse(["router", "--engine", "e:1", "--tokenizer", "t:2"]).dns_refresh_interval > 0


# ---------------------------------------------------------------------------
# Each check fails on a broken copy

Mutation = Callable[[list[Resource]], None]


def _workload(resources: list[Resource], kind: str, name: str) -> Resource:
    return find(resources, kind, name)[0]


def _container(resources: list[Resource], kind: str, name: str, index: int = 0) -> dict[str, Any]:
    return _workload(resources, kind, name)["spec"]["template"]["spec"]["containers"][index]


ENGINE = ("StatefulSet", "turnout-engine")
ROUTER = ("Deployment", "turnout-router")
GATEWAY = ("Deployment", "turnout-gateway")
TOKENIZER = ("Deployment", "turnout-tokenizer")


def _replace_arg(target: tuple[str, str], old: str, new: str) -> Mutation:
    def mutate(resources: list[Resource]) -> None:
        c = _container(resources, *target)
        assert old in c["args"], f"{old} not in {c['args']}"
        c["args"] = [new if a == old else a for a in c["args"]]

    return mutate


def _edit_container(target: tuple[str, str], edit: Callable[[dict[str, Any]], None]) -> Mutation:
    def mutate(resources: list[Resource]) -> None:
        edit(_container(resources, *target))

    return mutate


def _edit_pod(target: tuple[str, str], edit: Callable[[dict[str, Any]], None]) -> Mutation:
    def mutate(resources: list[Resource]) -> None:
        edit(_workload(resources, *target)["spec"]["template"]["spec"])

    return mutate


def _edit(kind: str, name: str, edit: Callable[[Resource], None]) -> Mutation:
    def mutate(resources: list[Resource]) -> None:
        for r in find(resources, kind, name):
            edit(r)

    return mutate


def _set_env(name: str, entry: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        c["env"] = [e for e in c.get("env") or [] if e["name"] != name] + [{"name": name, **entry}]

    return edit


def _drop_env(name: str) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        c["env"] = [e for e in c["env"] if e["name"] != name]

    return edit


def _set_port(name: str, number: int) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        for p in c["ports"]:
            if p["name"] == name:
                p["containerPort"] = number

    return edit


def _mount(path: str, **changes: Any) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        for m in c["volumeMounts"]:
            if m["mountPath"] == path:
                m.update(changes)

    return edit


def _probe(kind: str, probe: dict[str, Any] | None) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        if probe is None:
            c.pop(kind)
        else:
            c[kind] = probe

    return edit


def _security(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def edit(c: dict[str, Any]) -> None:
        c["securityContext"].update(changes)

    return edit


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set a dotted path inside a dict (creating nothing: the path must exist up to the last key)."""

    def edit(node: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            node = node[key]
        node[last] = value

    return edit


def _drop_service(name: str) -> Mutation:
    def mutate(resources: list[Resource]) -> None:
        resources[:] = [r for r in resources if not (r["kind"] == "Service" and r["metadata"]["name"] == name)]

    return mutate


def _drop_kind(kind: str) -> Mutation:
    def mutate(resources: list[Resource]) -> None:
        resources[:] = [r for r in resources if r["kind"] != kind]

    return mutate


def _require_api_key(c: dict[str, Any]) -> None:
    """TURNOUT_API_KEY from the real Secret, no longer optional (the test's secrets.env has none)."""
    (entry,) = [e for e in c["env"] if e["name"] == "TURNOUT_API_KEY"]
    entry["valueFrom"]["secretKeyRef"].pop("optional")


# (build, check, mutation)
BROKEN: dict[str, tuple[str, str, Mutation]] = {
    "misspelled field": ("base", "schema", _edit_pod(ENGINE, _set("terminationGracePeriod", 60))),
    "port as a word": ("base", "schema", _edit_container(TOKENIZER, _set_port("grpc", "grpc"))),  # type: ignore[arg-type]
    "misspelled flag": ("base", "commands", _replace_arg(ENGINE, "--served-model-name", "--servedmodel-name")),
    "flag of another subcommand": ("base", "commands", _replace_arg(ROUTER, "--engine", "--model")),
    "bad policy": ("base", "commands", _replace_arg(ROUTER, "cache_aware", "smartest")),
    "undefined variable": ("base", "commands", _edit_container(ENGINE, _drop_env("TURNOUT_DEVICE"))),
    "command overrides turnout": (
        "base",
        "commands",
        _edit_container(GATEWAY, _set("command", ["python", "-m", "gateway"])),
    ),
    "gateway runs the router": ("base", "commands", _replace_arg(GATEWAY, "gateway", "router")),
    "wrong container port": ("base", "ports", _edit_container(ENGINE, _set_port("grpc", 50052))),
    "wrong metrics port": ("base", "ports", _edit_container(ROUTER, _set_port("metrics", 9090))),
    "scrape annotation on the gRPC port": (
        "base",
        "ports",
        _edit(
            *ENGINE, lambda w: w["spec"]["template"]["metadata"]["annotations"].update({"prometheus.io/port": "50051"})
        ),
    ),
    "loopback bind": ("base", "ports", _replace_arg(TOKENIZER, "0.0.0.0", "127.0.0.1")),
    "probe on another port": ("base", "probes", _edit_container(ENGINE, _set("readinessProbe.grpc.port", 9091))),
    "gRPC probe on the gateway": (
        "base",
        "probes",
        _edit_container(GATEWAY, _probe("readinessProbe", {"grpc": {"port": 8000}})),
    ),
    "probe of a named service": ("base", "probes", _edit_container(ROUTER, _set("livenessProbe.grpc.service", "x"))),
    "no startup probe for a slow load": ("base", "probes", _edit_container(ENGINE, _probe("startupProbe", None))),
    "no liveness": ("base", "probes", _edit_container(ROUTER, _probe("livenessProbe", None))),
    "liveness on the router's health": (
        "base",
        "probes",
        _edit_container(GATEWAY, _set("livenessProbe.httpGet.path", "/health")),
    ),
    "probe needs a key": (
        "base",
        "probes",
        _edit_container(GATEWAY, _set("readinessProbe.httpGet.path", "/v1/models")),
    ),
    "service selects nothing": (
        "base",
        "selectors",
        _edit("Service", "turnout-tokenizer", _set("spec.selector", {"app.kubernetes.io/component": "tokeniser"})),
    ),
    "service targets a missing port": (
        "base",
        "selectors",
        _edit("Service", "turnout-router", lambda s: s["spec"]["ports"][0].update(targetPort="rpc")),
    ),
    "workload selector misses its pods": (
        "base",
        "selectors",
        _edit(*GATEWAY, lambda w: w["spec"]["selector"]["matchLabels"].update({"app.kubernetes.io/component": "gw"})),
    ),
    "pdb selects nothing": (
        "base",
        "selectors",
        _edit("PodDisruptionBudget", "turnout-engine", _set("spec.selector.matchLabels", {"app": "engine"})),
    ),
    "ingress to a missing port": (
        "base",
        "selectors",
        _edit(
            "Ingress",
            "turnout-gateway",
            lambda i: i["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"].update(port={"name": "https"}),
        ),
    ),
    "tokenizer service misspelled": (
        "base",
        "addresses",
        _replace_arg(ROUTER, "turnout-tokenizer:50052", "turnout-tokenizers:50052"),
    ),
    "router pointed at the tokenizer": (
        "base",
        "addresses",
        _replace_arg(GATEWAY, "turnout-router:50050", "turnout-tokenizer:50052"),
    ),
    "router on the metrics port": (
        "base",
        "addresses",
        _replace_arg(GATEWAY, "turnout-router:50050", "turnout-router:9091"),
    ),
    "another namespace": (
        "base",
        "addresses",
        _replace_arg(GATEWAY, "turnout-router:50050", "turnout-router.default:50050"),
    ),
    "engine service not headless": (
        "base",
        "engine_discovery",
        _edit("Service", "turnout-engine", _set("spec.clusterIP", "10.0.0.1")),
    ),
    "engine by pod name": (
        "base",
        "engine_discovery",
        _replace_arg(ROUTER, "turnout-engine:50051", "turnout-engine-0:50051"),
    ),
    "wrong engine port": (
        "base",
        "engine_discovery",
        _replace_arg(ROUTER, "turnout-engine:50051", "turnout-engine:50052"),
    ),
    "unready engines published": (
        "base",
        "engine_discovery",
        _edit("Service", "turnout-engine", _set("spec.publishNotReadyAddresses", True)),
    ),
    "statefulset governed by another service": (
        "base",
        "engine_discovery",
        _edit(*ENGINE, _set("spec.serviceName", "engines")),
    ),
    "DNS looked up hourly": ("base", "engine_discovery", _replace_arg(ROUTER, "5", "3600")),
    "engine service dropped": ("base", "engine_discovery", _drop_service("turnout-engine")),
    "variable nobody reads": (
        "base",
        "env",
        _edit_container(ROUTER, _set_env("TURNOUT_ROUTER_POLICY", {"value": "x"})),
    ),
    "missing secret": (
        "base",
        "env",
        _edit_container(
            TOKENIZER,
            _set_env(
                "TURNOUT_INTERNAL_TOKEN",
                {"valueFrom": {"secretKeyRef": {"name": "nope", "key": "TURNOUT_INTERNAL_TOKEN"}}},
            ),
        ),
    ),
    "missing required key": ("base", "env", _edit_container(GATEWAY, _require_api_key)),
    "token written in the manifest": (
        "base",
        "secrets",
        _edit_container(ROUTER, _set_env("TURNOUT_INTERNAL_TOKEN", {"value": "abc"})),
    ),
    "no token": ("base", "secrets", _edit_container(ENGINE, _drop_env("TURNOUT_INTERNAL_TOKEN"))),
    "optional token": (
        "base",
        "secrets",
        _edit_container(GATEWAY, lambda c: c["env"][1]["valueFrom"]["secretKeyRef"].update(optional=True)),
    ),
    "root": ("base", "security", _edit_pod(ROUTER, _set("securityContext.runAsUser", 0))),
    "writable root fs": ("base", "security", _edit_container(ENGINE, _security(readOnlyRootFilesystem=False))),
    "capabilities kept": ("base", "security", _edit_container(TOKENIZER, _security(capabilities={}))),
    "service account token": ("base", "security", _edit_pod(GATEWAY, _set("automountServiceAccountToken", True))),
    "no writable tmp": ("base", "security", _edit_container(ENGINE, lambda c: c["volumeMounts"].pop())),
    "model writable": ("base", "model_volume", _edit_container(ENGINE, _mount("/models", readOnly=False))),
    "model from elsewhere": ("base", "model_volume", _replace_arg(TOKENIZER, "/models/default", "/srv/model")),
    "model-init writes read-only": (
        "base",
        "model_volume",
        _edit(
            "Job",
            "turnout-model-init",
            lambda j: j["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0].update(readOnly=True),
        ),
    ),
    "fsGroup on a reader": ("base", "model_volume", _edit_pod(ENGINE, _set("securityContext.fsGroup", 1000))),
    "no wait for the model": ("base", "model_volume", _edit_pod(TOKENIZER, lambda p: p.pop("initContainers"))),
    "grace shorter than the drain": ("base", "grace", _edit_pod(ENGINE, _set("terminationGracePeriodSeconds", 30))),
    "no preStop": ("base", "grace", _edit_container(GATEWAY, lambda c: c.pop("lifecycle"))),
    "engine gone before the router looks": (
        "base",
        "grace",
        _edit_container(ENGINE, _set("lifecycle.preStop.exec.command", ["sleep", "1"])),
    ),
    "no requests": ("base", "resources", _edit_container(ROUTER, lambda c: c["resources"].pop("requests"))),
    "no memory limit": ("base", "resources", _edit_container(ENGINE, lambda c: c["resources"].pop("limits"))),
    "another image": ("base", "image", _edit_container(GATEWAY, _set("image", "turnout:latest"))),
    "GPU on the CPU default": (
        "base",
        "device",
        _edit_container(ENGINE, lambda c: c["resources"]["limits"].update({"nvidia.com/gpu": 1})),
    ),
    "cuda without a GPU": (
        "gpu",
        "device",
        _edit_container(ENGINE, lambda c: c["resources"]["limits"].pop("nvidia.com/gpu")),
    ),
    "cpu on the GPU overlay": ("gpu", "device", _edit_container(ENGINE, _set_env("TURNOUT_DEVICE", {"value": "cpu"}))),
    "HPA on a metric nobody exports": (
        "autoscaling",
        "autoscaling",
        _edit(
            "HorizontalPodAutoscaler",
            "turnout-engine",
            lambda h: h["spec"]["metrics"][0]["pods"]["metric"].update(name="vllm_queue"),
        ),
    ),
    "HPA scales the router": (
        "autoscaling",
        "autoscaling",
        _edit("HorizontalPodAutoscaler", "turnout-engine", _set("spec.scaleTargetRef.name", "turnout-router")),
    ),
    "no PDB": ("autoscaling", "autoscaling", _drop_kind("PodDisruptionBudget")),
    "engine metrics off": (
        "autoscaling",
        "autoscaling",
        _edit_container(ENGINE, lambda c: c.update(args=c["args"][:-2])),
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_check_catches_broken_build(built: dict[str, list[Resource]], case: str) -> None:
    build, check, mutate = BROKEN[case]
    broken = copy.deepcopy(built[build])
    mutate(broken)
    assert CHECKS[build][check](broken) != []


def test_every_check_has_a_failing_case() -> None:
    assert {check for _, check, _ in BROKEN.values()} == {check for checks in CHECKS.values() for check in checks}


def test_grace_follows_the_code(built: dict[str, list[Resource]], monkeypatch: pytest.MonkeyPatch) -> None:
    """A service that drains longer than its pod's grace period is caught."""
    import tests.kubernetes_checks as checks

    monkeypatch.setattr(checks, "drain_seconds", lambda command: 120.0 if command == "tokenizer" else 1.0)
    assert [p for p in check_grace(built["base"]) if "turnout-tokenizer" in p]


def test_models_volume_is_shared_across_nodes_unless_there_is_one(built: dict[str, list[Resource]]) -> None:
    def modes(build: str) -> list[str]:
        (claim,) = find(built[build], "PersistentVolumeClaim")
        return list(claim["spec"]["accessModes"])

    assert modes("base") == modes("gpu") == ["ReadWriteMany"]
    assert modes("single-node") == ["ReadWriteOnce"]
