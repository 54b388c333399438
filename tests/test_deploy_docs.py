"""docs/deploy.md says what exists: its compose overrides follow the Compose Specification and the
CLI, its kustomize overlay builds and passes the checks, its commands name real paths, resources
and flags, and the READMEs link to it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.kubernetes_checks import CHECKS, CliError, parse
from tests.kubernetes_manifests import ROOT, Resource, containers, copy_tree, find, kustomize
from tests.test_deploy import command_argv, load_compose, resolve, services
from tests.test_deploy_compose_schema import schema_problems

DOC = ROOT / "docs" / "deploy.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC.read_text(), re.MULTILINE | re.DOTALL)


def yaml_blocks() -> dict[str, dict[str, Any]]:
    """path -> document, for each yaml block whose first line is `# PATH` or `# PATH: why`."""
    out = {}
    for block in blocks("yaml"):
        first = block.splitlines()[0]
        m = re.fullmatch(r"# (\S+?):?(?: .*)?", first)
        assert m is not None, f"a yaml block without its path on the first line: {first!r}"
        out[m.group(1)] = yaml.safe_load(block)
    return out


def shell_commands() -> list[list[str]]:
    """Each command of the sh blocks: continuation lines and quoted newlines joined, comments dropped."""
    commands = []
    for block in blocks("sh"):
        pending = ""
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            pending += line + "\n"
            try:
                words = shlex.split(pending, comments=True)
            except ValueError:  # a quote still open: the command goes on
                continue
            pending = ""
            if words:
                commands.append(words)
        assert not pending, f"unclosed quote in {pending!r}"
    return commands


def test_readmes_link_the_deploy_guide() -> None:
    assert "docs/deploy.md" in (ROOT / "README.md").read_text()
    assert "../docs/deploy.md" in (ROOT / "deploy" / "README.md").read_text()


def test_compose_overrides_follow_the_spec_and_the_cli() -> None:
    base = services(load_compose())
    overrides = {p: d for p, d in yaml_blocks().items() if "services" in d}
    assert overrides, "the guide shows no compose override"
    for path, doc in overrides.items():
        assert path.startswith("deploy/docker-compose.") and path.endswith(".yml"), path
        doc = resolve(doc, {})
        assert schema_problems(doc) == [], path
        for name, svc in doc["services"].items():
            assert name in base, f"{path}: no service {name} in deploy/docker-compose.yml"
            if "command" not in svc:
                continue
            argv = command_argv(svc)
            args = parse(argv)
            assert args.command == command_argv(base[name])[0], f"{path}: {name} runs {args.command}"
            # Replacing a command must keep every flag the stack's own command sets.
            kept = {a for a in command_argv(base[name]) if a.startswith("--")}
            assert kept <= set(argv), f"{path}: {name} drops {sorted(kept - set(argv))}"
            for flag in ("--engine", "--tokenizer", "--router"):
                for value in getattr(args, flag[2:], None) or []:
                    host = value.rpartition(":")[0]
                    assert "." in host or host in base, f"{path}: {flag} {value} names no service"


def test_the_guides_overlay_builds_and_passes_the_checks(tmp_path: Path) -> None:
    overlays = {p: d for p, d in yaml_blocks().items() if d.get("kind") == "Kustomization"}
    assert overlays, "the guide shows no overlay"
    tree = copy_tree(tmp_path)
    for path, doc in overlays.items():
        assert path.startswith("deploy/kubernetes/"), path
        folder = tree / Path(path).relative_to("deploy/kubernetes").parent
        folder.mkdir(parents=True)
        (folder / "kustomization.yaml").write_text(yaml.safe_dump(doc))
        resources = kustomize(folder)
        (image,) = doc["images"]
        wanted = f"{image['newName']}:{image['newTag']}"
        assert {c.spec["image"] for c in containers(resources)} == {wanted}
        for name, check in CHECKS["gpu"].items():
            if name != "image":
                assert check(resources) == [], f"{path}: {name}"


@pytest.fixture(scope="module")
def base_build(tmp_path_factory: pytest.TempPathFactory) -> list[Resource]:
    return kustomize(copy_tree(tmp_path_factory.mktemp("k8s")) / "base")


def test_commands_name_what_exists(base_build: list[Resource]) -> None:
    declared = set(yaml_blocks())
    kinds = {"job": "Job", "statefulset": "StatefulSet", "deployment": "Deployment", "service": "Service"}
    for words in shell_commands():
        line = " ".join(words)
        if words[0] == "kubectl" and "-k" in words:
            target = words[words.index("-k") + 1]
            assert (ROOT / target / "kustomization.yaml").is_file() or f"{target}/kustomization.yaml" in declared, line
        for kind, name in re.findall(r"\b(job|statefulset|deployment|service)/([a-z0-9-]+)", line):
            assert find(base_build, kinds[kind], name), f"{line}: no {kinds[kind]} {name}"
        if words[0] == "kubectl" and "-n" in words:
            assert words[words.index("-n") + 1] == "turnout", line
        for i, word in enumerate(words):
            if word == "-f" and words[i + 1].startswith("deploy/"):
                assert (ROOT / words[i + 1]).is_file() or words[i + 1] in declared, line


def test_turnout_commands_parse() -> None:
    """Every `turnout ...` and `make serve ARGS=...` of the guide, through the real parser."""
    argvs = []
    for words in shell_commands():
        if words[0] == "turnout":
            argvs.append(words[1:])
        if words[:2] == ["make", "serve"]:
            extra = [w.removeprefix("ARGS=") for w in words[2:] if w.startswith("ARGS=")]
            argvs.append(["serve", *shlex.split(" ".join(extra))])
    assert len(argvs) >= 5
    for argv in argvs:
        try:
            parse(argv)
        except CliError as e:
            pytest.fail(f"`turnout {' '.join(argv)}`: {e}")


def test_paths_the_guide_names_exist() -> None:
    created = {*yaml_blocks(), "deploy/.env", "deploy/kubernetes/base/secrets.env"}
    created |= {str(Path(p).parent) for p in created}
    for path in set(re.findall(r"\b((?:deploy|docs)/[\w./-]*\w)", DOC.read_text())):
        assert (ROOT / path).exists() or path in created, f"docs/deploy.md names {path}, which does not exist"
