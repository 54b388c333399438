"""deploy/docker-compose.yml against the Compose Specification's JSON schema, offline.

The schema is compose-spec/compose-spec's schema/compose-spec.json (Apache-2.0) as check-jsonschema
vendors it (its builtin `vendor.compose-spec`): the dev extra pins that package, so the schema is
pinned with it. The file is validated as Compose reads it: YAML merge keys applied and the
`${VAR}` defaults filled in (tests/test_deploy.py's `load_compose`).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable
from importlib import resources
from typing import Any

import jsonschema
import pytest
import yaml

from tests.test_deploy import COMPOSE_FILE, load_compose


@functools.cache
def compose_schema() -> dict[str, Any]:
    text = resources.files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def schema_problems(doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft202012Validator(
        compose_schema(), format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def test_schema_is_the_compose_spec() -> None:
    schema = compose_schema()
    assert schema["title"] == "Compose Specification"
    assert "services" in schema["properties"]


def test_compose_file_follows_the_compose_spec() -> None:
    assert schema_problems(load_compose()) == []


def test_compose_file_as_written_follows_the_compose_spec() -> None:
    """Before interpolation too: every `${...}` sits where a string is allowed."""
    assert schema_problems(yaml.safe_load(COMPOSE_FILE.read_text())) == []


def _service(name: str, key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        doc["services"][name][key] = value

    return mutate


def _depends(name: str, dep: str, condition: str) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        doc["services"][name]["depends_on"][dep]["condition"] = condition

    return mutate


BROKEN: dict[str, Callable[[dict[str, Any]], None]] = {
    "misspelled key": _service("engine", "stop_grace_periods", "30s"),
    "restart as a number": _service("router", "restart", 5),
    "unknown condition": _depends("gateway", "router", "service_ready"),
    "healthcheck test as a number": _service("tokenizer", "healthcheck", {"test": 1}),
    "volumes as a mapping": _service("engine", "volumes", {"models": "/models"}),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_schema_catches_a_broken_compose_file(case: str) -> None:
    broken = copy.deepcopy(load_compose())
    BROKEN[case](broken)
    assert schema_problems(broken) != []
