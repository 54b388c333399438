"""`priority` has an effect under `turnout serve`: its --scheduling-policy reaches every engine, and
an engine scheduling first-come-first-served refuses a priority it would ignore."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.engine.config import EngineConfig
from services.engine.convert import request_from_proto
from services.engine.main import build_parser as engine_parser
from turnout import launcher
from turnout.errors import InvalidArgument
from turnout.v1 import engine_pb2


def _engine_args(argv: list[str]) -> list[object]:
    stack = launcher.build_stack(launcher.build_parser().parse_args(["--model", "/m", *argv]), Path("/m"))
    engines = [child for child in stack.children if child.name.startswith("engine")]
    return [engine_parser().parse_args(e.argv[e.argv.index("engine") + 1 :]) for e in engines]


def test_serve_passes_the_scheduling_policy_to_every_engine() -> None:
    engines = _engine_args(["--engines", "2", "--scheduling-policy", "priority"])
    assert [e.scheduling_policy for e in engines] == ["priority", "priority"]  # type: ignore[attr-defined]
    (plain,) = _engine_args([])
    assert plain.scheduling_policy == "fcfs"  # type: ignore[attr-defined]


def test_fcfs_engine_refuses_a_priority(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    message = engine_pb2.EngineGenerateRequest(request_id="r", input_ids=[1, 2], priority=3)
    config = EngineConfig(model=tmp_path)
    with pytest.raises(InvalidArgument, match="--scheduling-policy priority"):
        request_from_proto(message, loaded=None, config=config)  # type: ignore[arg-type]
